package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// pause is PID 1 of a pod's shared PID namespace: it holds the namespace,
// reaps the zombies reparented to it, and exits 0 on SIGTERM or SIGINT (a
// PID 1 gets no default signal action, so it must handle them itself).
func pause() int {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, unix.SIGTERM, unix.SIGINT, unix.SIGCHLD)
	for sig := range ch {
		if sig != unix.SIGCHLD {
			return 0
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}
