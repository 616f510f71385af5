package server

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// Leftovers are containers in this pod folder that this shim process did
// not create: an earlier shim of the pod died. They are not its children,
// so it cannot learn their exit code; it can still report, signal and
// remove them through libcontainer's saved state.

func (s *Server) leftoverState(id string) (shim.State, error) {
	st, ex, err := shim.ReadRecords(shim.ContainerDir(s.dir, id))
	if err != nil {
		return shim.State{}, err
	}
	if ex != nil {
		return shim.StateFromRecords(id, st, ex), nil
	}
	state := shim.StateFromRecords(id, st, nil)
	lc, err := libcontainer.Load(s.lcRoot, id)
	if err != nil {
		if st == nil {
			return shim.State{}, fmt.Errorf("%w: %s", shim.ErrNotFound, id)
		}
		state.Status, state.ExitCode = shim.StatusStopped, shim.UnknownExitCode
		return state, nil
	}
	status, err := lc.Status()
	if err != nil {
		return shim.State{}, err
	}
	switch status {
	case libcontainer.Created:
		state.Status = shim.StatusCreated
	case libcontainer.Stopped:
		state.Status, state.ExitCode = shim.StatusStopped, shim.UnknownExitCode
	default:
		state.Status = shim.StatusRunning
	}
	if ls, err := lc.State(); err == nil && state.Status != shim.StatusStopped {
		state.Pid = ls.InitProcessPid
	}
	return state, nil
}

// waitLeftover polls: a leftover is not a child, there is no exit to reap.
func (s *Server) waitLeftover(id string, timeout <-chan time.Time) (shim.State, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := s.leftoverState(id)
		if err != nil || st.Status == shim.StatusStopped {
			return st, err
		}
		select {
		case <-tick.C:
		case <-timeout:
			return st, nil
		}
	}
}

func (s *Server) loadLeftover(id string) (*libcontainer.Container, error) {
	lc, err := libcontainer.Load(s.lcRoot, id)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, libcontainer.ErrNotExist) {
		if st, ex, _ := shim.ReadRecords(shim.ContainerDir(s.dir, id)); st != nil || ex != nil {
			return nil, nil // known, already removed
		}
		return nil, fmt.Errorf("%w: %s", shim.ErrNotFound, id)
	}
	return lc, err
}

func (s *Server) killLeftover(id string, sig unix.Signal, all bool) error {
	lc, err := s.loadLeftover(id)
	if lc == nil || err != nil {
		return err
	}
	if all {
		return signalAll(lc, sig)
	}
	if err := lc.Signal(sig); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		return err
	}
	return nil
}

func (s *Server) deleteLeftover(id string) error {
	lc, err := s.loadLeftover(id)
	if lc == nil || err != nil {
		return err
	}
	if st, err := lc.Status(); err != nil || st != libcontainer.Stopped {
		return fmt.Errorf("%w: %s", shim.ErrNotStopped, id)
	}
	return lc.Destroy()
}
