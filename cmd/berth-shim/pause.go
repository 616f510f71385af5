package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// pause is PID 1 of a pod's shared PID namespace: it holds the namespace
// and reaps the zombies reparented to it. It ignores every signal: any root
// process in the pod can signal it, and its exit would end every container
// of the pod. Only SIGKILL from outside the namespace (berthd stopping the
// pod) ends it; the kernel never delivers SIGKILL or SIGSTOP to a PID 1 from
// inside its own namespace.
func pause() int {
	signal.Ignore()
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, unix.SIGCHLD)
	for range ch {
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
