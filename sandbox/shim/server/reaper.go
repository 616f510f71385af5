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
// child subreaper, so container inits, exec'd processes and every orphan
// below them end up here; wait4(-1) reaps them all and hands the status of
// the ones registered to their owner.
//
// libcontainer waits for its own helper processes (runc init's stages)
// while it spawns; a wait4(-1) at that moment would steal their status and
// fail the spawn. So spawns hold gate shared and the reaper takes it
// exclusively: it never runs during a spawn, and the spawned pid is
// registered before the gate is released, so its exit cannot be missed.
type reaper struct {
	gate    sync.RWMutex
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
	r.gate.Lock()
	defer r.gate.Unlock()
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
		r.mu.Lock()
		fn := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if fn != nil {
			go fn(exit{status: ws, at: time.Now()})
		}
	}
}

// hold runs f with the reaper held off, for libcontainer calls that wait
// for helper children of their own outside a spawn: specconv reads the
// mappings of a user namespace it joins from a child.
func (r *reaper) hold(f func() error) error {
	r.gate.RLock()
	defer r.gate.RUnlock()
	return f()
}

// spawn runs start (which starts a process through libcontainer and
// returns its pid) with the reaper held off, and registers onExit for it.
func (r *reaper) spawn(start func() (int, error), onExit func(exit)) (int, error) {
	r.gate.RLock()
	defer r.gate.RUnlock()
	pid, err := start()
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.waiters[pid] = onExit
	r.mu.Unlock()
	return pid, nil
}
