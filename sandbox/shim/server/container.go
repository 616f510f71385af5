package server

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/shim/crilog"
)

// drainLimit bounds how long an exit waits for the output to reach EOF.
const drainLimit = 2 * time.Second

// ctr is a container this shim created (and so can wait for).
type ctr struct {
	id     string
	dir    string // containers/<id>: records
	bundle string // holds config.json
	init   *spawned
	log    *crilog.Writer
	io     *stdio
	// stdinOnce closes the container's stdin when an attach with stdin ends.
	stdinOnce bool
	cgroup    string // lists its processes (cgroup.procs, and its children's)
	oom       *oomCounter
	// cgroupPaths are its cgroups, which delete removes itself unless
	// deleteByOp (see shim.OpReply).
	cgroupPaths map[string]string
	deleteByOp  bool
	// restore, until Start has CRIU restore the container from it: the
	// create spawned no init (init is nil), and stdin is whether its
	// stdin stays open.
	restore *shim.RestoreRequest
	stdin   bool

	// execInit is what berth-exec-init needs of it (shim.ExecInitFile),
	// read at its first exec; nil: its execs go through libcontainer.
	// execCgroup is its cgroup when exec inits are cloned into it (see
	// shim.CloneableCgroup), else "".
	execInitOnce sync.Once
	execInit     []byte
	execCgroup   string

	// startMu orders Create's setup and Start's started.json before the
	// exit handling.
	startMu sync.Mutex

	// Guarded by Server.mu.
	state  shim.State
	exited chan struct{} // closed once stopped and exit.json is written
}

func (c *ctr) execInitFile() string {
	return filepath.Join(c.bundle, shim.ExecInitFile)
}

// running is the container id unless its init has exited.
func (s *Server) running(id string) (*ctr, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, err
	}
	select {
	case <-c.exited:
		return nil, fmt.Errorf("%w: %s", shim.ErrNotRunning, id)
	default:
		return c, nil
	}
}

func (s *Server) get(id string) (*ctr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.ctrs[id]
	if c == nil {
		return nil, fmt.Errorf("%w: %s", shim.ErrNotFound, id)
	}
	return c, nil
}

func (s *Server) create(req *shim.CreateRequest) (err error) {
	s.mu.Lock()
	if s.ctrs[req.ID] != nil || s.creating[req.ID] {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s", shim.ErrExists, req.ID)
	}
	s.creating[req.ID] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.creating, req.ID)
		s.mu.Unlock()
	}()

	bundle := req.Bundle
	if bundle == "" {
		bundle = shim.ContainerDir(s.dir, req.ID)
	}
	tty, err := wantsTTY(bundle, req.TTY)
	if err != nil {
		return err
	}
	c := &ctr{id: req.ID, dir: shim.ContainerDir(s.dir, req.ID), bundle: bundle,
		exited: make(chan struct{}), state: shim.State{ID: req.ID, Status: shim.StatusCreated}}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	// Records of an earlier container with this ID must not describe this one.
	os.Remove(filepath.Join(c.dir, shim.ExitFile))
	os.Remove(filepath.Join(c.dir, shim.StartedFile))

	if c.log, err = crilog.Open(req.LogPath, req.LogDir); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			c.log.Close()
		}
	}()
	c.stdinOnce = req.StdinOnce
	if c.io, err = newStdio(req.Stdin, tty); err != nil {
		return err
	}
	c.stdin, c.restore = req.Stdin, req.Restore
	if c.restore == nil {
		// startMu keeps onExit out until the bookkeeping is done.
		c.startMu.Lock()
		// The init stops at the exec fifo ("created") until Start.
		err = s.spawnInit(c, &shim.OpRequest{Op: shim.OpCreate, ID: req.ID, Bundle: bundle, Stdio: c.io.opStdio()})
		c.startMu.Unlock()
		if err != nil {
			c.io.close()
			return err
		}
	}
	s.mu.Lock()
	s.ctrs[req.ID] = c
	s.emit(shim.EventCreated, c.state)
	s.mu.Unlock()
	return nil
}

// spawnInit has an op process make the container and bring its init to
// life as req says (create or restore), and takes its stdio; on failure
// nothing of it is left. The caller holds c.startMu.
func (s *Server) spawnInit(c *ctr, req *shim.OpRequest) error {
	sp, r, err := s.spawn(req, c.io.child, c.onExit(s))
	if err != nil {
		return err
	}
	s.mu.Lock()
	c.init = sp
	c.state.Pid = sp.pid
	s.mu.Unlock()
	c.cgroup, c.oom = r.Cgroup, watchOOM(r.OOMEvents)
	c.cgroupPaths, c.deleteByOp = r.CgroupPaths, r.DeleteByOp || r.CgroupPaths == nil
	if err := c.io.started(c.log, c.stdin); err != nil {
		c.init.signal(unix.SIGKILL)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
		}
		s.runOp(&shim.OpRequest{Op: shim.OpDelete, ID: c.id}, nil, nil)
		c.init.close()
		return err
	}
	return nil
}

// onExit is registered with the reaper for the container's init.
func (c *ctr) onExit(s *Server) func(exit) {
	return func(e exit) {
		// Create and Start hold startMu while they set the container up and
		// record its start; exit.json must not precede started.json.
		c.startMu.Lock()
		defer c.startMu.Unlock()
		c.io.drain(drainLimit)
		c.log.Close()
		code, sig := e.code()
		rec := shim.ExitRecord{ExitCode: code, Signal: sig, FinishedAt: e.at, OOMKilled: c.oom.killed()}
		if err := shim.WriteJSONDurable(filepath.Join(c.dir, shim.ExitFile), rec); err != nil {
			log.Printf("container %s: write exit record: %v", c.id, err)
		}
		s.mu.Lock()
		c.state.Status = shim.StatusStopped
		c.state.ExitCode, c.state.Signal, c.state.OOMKilled = code, sig, rec.OOMKilled
		c.state.FinishedAt = e.at
		s.emit(shim.EventExited, c.state)
		s.mu.Unlock()
		close(c.exited)
	}
}

func (s *Server) start(id string) (shim.State, error) {
	c, err := s.get(id)
	if err != nil {
		return shim.State{}, err
	}
	c.startMu.Lock()
	defer c.startMu.Unlock()
	s.mu.Lock()
	st := c.state.Status
	s.mu.Unlock()
	if st != shim.StatusCreated {
		return shim.State{}, fmt.Errorf("%w: %s is %s", shim.ErrNotCreated, id, st)
	}
	if c.restore != nil {
		// CRIU restores the processes running: there is no fifo to open.
		op := &shim.OpRequest{Op: shim.OpRestore, ID: c.id, Bundle: c.bundle, Stdio: c.io.opStdio(), Restore: c.restore}
		if err := s.spawnInit(c, op); err != nil {
			return shim.State{}, err
		}
		c.restore = nil
	} else if err := s.execFifo(c); err != nil {
		return shim.State{}, err
	}
	rec := shim.StartRecord{Pid: c.state.Pid, StartedAt: time.Now()}
	if err := shim.WriteJSONDurable(filepath.Join(c.dir, shim.StartedFile), rec); err != nil {
		log.Printf("container %s: write start record: %v", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c.state.StartedAt = rec.StartedAt
	if c.state.Status == shim.StatusCreated {
		c.state.Status = shim.StatusRunning
		s.emit(shim.EventStarted, c.state)
	}
	return c.state, nil
}

func (s *Server) kill(req *shim.KillRequest) error {
	sig := unix.Signal(req.Signal)
	c, err := s.get(req.ID)
	if errors.Is(err, shim.ErrNotFound) {
		return s.killLeftover(req.ID, sig, req.All)
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	stopped, init := c.state.Status == shim.StatusStopped, c.init
	s.mu.Unlock()
	if init == nil && !stopped {
		return s.endUnrestored(c, sig)
	}
	if req.All {
		return signalCgroup(c.cgroup, sig)
	}
	if stopped {
		return nil
	}
	return init.signal(sig)
}

// endUnrestored stops a container whose restore has not run (nor will),
// as if its init had been killed by sig before it ran: it has no process to
// signal. Start holds startMu while it restores; one that restored
// meanwhile is signalled.
func (s *Server) endUnrestored(c *ctr, sig unix.Signal) error {
	c.startMu.Lock()
	s.mu.Lock()
	init, st := c.init, c.state.Status
	if init == nil && st == shim.StatusCreated {
		c.state.Status = shim.StatusStopped // Start refuses it from here on
	}
	s.mu.Unlock()
	c.startMu.Unlock()
	switch {
	case init != nil:
		return init.signal(sig)
	case st != shim.StatusCreated:
		return nil // another kill ends it
	}
	close(c.io.done) // no output was copied, nor will be
	c.onExit(s)(exit{status: unix.WaitStatus(sig), at: time.Now()})
	return nil
}

func (s *Server) state(id string) (shim.State, error) {
	if c, err := s.get(id); err == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return c.state, nil
	}
	return s.leftoverState(id)
}

func (s *Server) wait(req *shim.WaitRequest) (shim.State, error) {
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	c, err := s.get(req.ID)
	if err != nil {
		return s.waitLeftover(req.ID, timeout)
	}
	select {
	case <-c.exited:
	case <-timeout:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.state, nil
}

func (s *Server) delete(id string) error {
	c, err := s.get(id)
	if errors.Is(err, shim.ErrNotFound) {
		return s.deleteLeftover(id)
	}
	if err != nil {
		return err
	}
	select {
	case <-c.exited:
	default:
		return fmt.Errorf("%w: %s", shim.ErrNotStopped, id)
	}
	switch {
	case c.init == nil:
		// Never restored: libcontainer has nothing of it.
	case c.deleteByOp:
		_, err = s.runOp(&shim.OpRequest{Op: shim.OpDelete, ID: id}, nil, nil)
	default:
		err = s.destroy(c)
	}
	if err != nil {
		return err
	}
	c.io.close()
	s.mu.Lock()
	if c.init != nil {
		c.init.close() // under s.mu: an exec may be taking a copy of its pidfd
	}
	delete(s.ctrs, id)
	s.emit(shim.EventDeleted, c.state)
	s.mu.Unlock()
	return nil
}

// update has an op process apply new limits and record them in the bundle's
// spec, so that status and a restarted shim see them.
func (s *Server) update(req *shim.UpdateRequest) error {
	c, err := s.running(req.ID)
	if err != nil {
		return err
	}
	_, err = s.runOp(&shim.OpRequest{Op: shim.OpUpdate, ID: c.id, Bundle: c.bundle, Resources: req.Resources}, nil, nil)
	return err
}

// checkpoint has an op process checkpoint a running container with CRIU,
// leaving it running. Past req.Timeout the op process and CRIU are killed,
// the container's cgroups thawed and the pod's network unlocked (CRIU
// freezes the one and locks the other while it dumps), so that the
// container runs on as before.
func (s *Server) checkpoint(req *shim.CheckpointRequest) error {
	c, err := s.running(req.ID)
	if err != nil {
		return err
	}
	op := &shim.OpRequest{Op: shim.OpCheckpoint, ID: c.id, Bundle: c.bundle, Checkpoint: req}
	_, timedOut, err := s.runOpWithin(op, nil, nil, req.Timeout)
	if timedOut {
		// CRIU, killed, neither thawed the container nor unlocked
		// the pod's network: both are undone here.
		undo := thaw(c.cgroupPaths)
		if _, err := s.runOp(&shim.OpRequest{Op: shim.OpUnlockNetwork, ID: c.id, Pid: c.init.pid}, nil, nil); err != nil {
			undo = errors.Join(undo, err)
		}
		if undo != nil {
			return fmt.Errorf("%w after %s, and undoing CRIU's freeze and network lock failed: %v", shim.ErrCheckpointTimeout, req.Timeout, undo)
		}
		return fmt.Errorf("%w after %s: stopped, the container runs on", shim.ErrCheckpointTimeout, req.Timeout)
	}
	return err
}

func (s *Server) reopenLog(id string) error {
	c, err := s.get(id)
	if err != nil {
		return err
	}
	select {
	case <-c.exited:
		// Its log is closed for good: a reopen would rotate nothing, and
		// the CRI caller must learn that the container is not running.
		return fmt.Errorf("%w: %s has exited", shim.ErrNotRunning, id)
	default:
	}
	return c.log.Reopen()
}
