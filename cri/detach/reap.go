package detach

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
)

// children are the helpers this process started and has not reaped: each
// one's exit must be waited for, or it stays a zombie. os/exec's Wait
// would hold a thread blocked per helper for its lifetime (a pod's, for a
// shim); instead one goroutine reaps them on SIGCHLD. It waits for those
// pids only, never wait4(-1): the process's other children (CNI plugins,
// exec.Command) are waited for by their own callers.
var children struct {
	sync.Mutex
	pids  map[int]bool
	start sync.Once
}

// startChild starts cmd, hands its process to the reaper and returns its
// PID (os/exec forgets it on Release).
func startChild(cmd *exec.Cmd) (int, error) {
	children.start.Do(func() {
		children.pids = map[int]bool{}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				reap()
			}
		}()
	})
	children.Lock()
	defer children.Unlock()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	children.pids[pid] = true
	// Waited for by pid from now on; Release drops os/exec's handle
	// (a pidfd) without waiting.
	return pid, cmd.Process.Release()
}

// reap reaps those of the started helpers that have exited.
func reap() {
	children.Lock()
	defer children.Unlock()
	for pid := range children.pids {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue // a later SIGCHLD comes back for it
		}
		if got == pid || err != nil { // reaped, or not ours any more (ECHILD)
			delete(children.pids, pid)
		}
	}
}

// Kill SIGKILLs the helper, unless it has been reaped already: until then
// its PID cannot belong to another process.
func (c Child) Kill() {
	children.Lock()
	defer children.Unlock()
	if children.pids[c.pid] {
		syscall.Kill(c.pid, syscall.SIGKILL)
	}
}
