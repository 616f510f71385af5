package server

import (
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// exit is what the reaper learned about one child.
type exit struct {
	status unix.WaitStatus
	at     time.Time
}

// code is the CRI exit code: the status, or 128+N when killed by signal N.
func (e exit) code() (code, sig int) {
	if e.status.Signaled() {
		s := int(e.status.Signal())
		return 128 + s, s
	}
	return e.status.ExitStatus(), 0
}

// reaper is the single place children are waited for. The shim is a
// child subreaper, so container inits, exec'd processes (once the op
// process that started them exits), berth-shim-helper's processes and
// every orphan below them end up here; wait4(-1) reaps them all and hands
// the status of the ones registered to their owner. A process is
// registered while the op process that started it still lives (see
// Server.runOp), so its exit cannot come first.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]func(exit)
}

func newReaper() *reaper {
	return &reaper{waiters: map[int]func(exit){}}
}

// run reaps on every SIGCHLD (and periodically, in case one was missed).
func (r *reaper) run() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGCHLD)
	tick := time.NewTicker(10 * time.Second)
	for {
		select {
		case <-ch:
		case <-tick.C:
		}
		r.reap()
	}
}

func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if !ws.Exited() && !ws.Signaled() {
			continue // stopped/continued: not an exit
		}
		r.deliver(pid, ws)
	}
}

// deliver hands an exit to the pid's waiter: one the shim reaped (its own
// child) or one the exec server reaped (its child).
func (r *reaper) deliver(pid int, ws unix.WaitStatus) {
	r.mu.Lock()
	fn := r.waiters[pid]
	delete(r.waiters, pid)
	r.mu.Unlock()
	if fn != nil {
		go fn(exit{status: ws, at: time.Now()})
	}
}

// start starts a child (start returns its pid) and has onExit called when
// it exits. The pid is registered before the reaper can hand out its exit:
// the child may exit, and be reaped, before start has returned.
func (r *reaper) start(start func() (int, error), onExit func(exit)) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err == nil {
		r.waiters[pid] = onExit
	}
	return pid, err
}

// register has onExit called when pid exits.
func (r *reaper) register(pid int, onExit func(exit)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiters[pid] = onExit
}
