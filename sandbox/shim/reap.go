package shim

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
)

// shims are the shims this process started and has not reaped: they are
// its children, and each one's exit must be waited for, or it stays a
// zombie. os/exec's Wait would hold a thread blocked per shim for the
// pod's lifetime; instead one goroutine reaps them on SIGCHLD. It waits
// for those pids only, never wait4(-1): the caller's other children (CNI
// plugins, exec.Command) are waited for by their own callers.
var shims struct {
	sync.Mutex
	pids  map[int]bool
	start sync.Once
}

// startChild starts cmd, hands its process to the reaper and returns its
// PID (os/exec forgets it on Release).
func startChild(cmd *exec.Cmd) (int, error) {
	shims.start.Do(func() {
		shims.pids = map[int]bool{}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				reapShims()
			}
		}()
	})
	shims.Lock()
	defer shims.Unlock()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	shims.pids[pid] = true
	// Waited for by pid from now on; Release drops os/exec's handle
	// (a pidfd) without waiting.
	return pid, cmd.Process.Release()
}

// reapShims reaps those of the started shims that have exited.
func reapShims() {
	shims.Lock()
	defer shims.Unlock()
	for pid := range shims.pids {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue // a later SIGCHLD comes back for it
		}
		if got == pid || err != nil { // reaped, or not ours any more (ECHILD)
			delete(shims.pids, pid)
		}
	}
}

// killChild SIGKILLs a shim this process started, unless it has been
// reaped already: until then its PID cannot belong to another process.
func killChild(pid int) {
	shims.Lock()
	defer shims.Unlock()
	if shims.pids[pid] {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
