package server

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// Leftovers are containers in this pod folder that this shim process did
// not create: an earlier shim of the pod died. They are not its children,
// so it cannot learn their exit code; it can still report, signal and
// remove them through libcontainer's saved state, which an op process reads.

func (s *Server) leftoverState(id string) (shim.State, error) {
	st, ex, err := shim.ReadRecords(shim.ContainerDir(s.dir, id))
	if err != nil {
		return shim.State{}, err
	}
	if ex != nil {
		return shim.StateFromRecords(id, st, ex), nil
	}
	state := shim.StateFromRecords(id, st, nil)
	r, err := s.runOp(&shim.OpRequest{Op: shim.OpState, ID: id}, nil, nil)
	if err != nil {
		return shim.State{}, err
	}
	if r.NotFound {
		if st == nil {
			return shim.State{}, fmt.Errorf("%w: %s", shim.ErrNotFound, id)
		}
		state.Status, state.ExitCode = shim.StatusStopped, shim.UnknownExitCode
		return state, nil
	}
	state.Status = r.Status
	if r.Status == shim.StatusStopped {
		state.ExitCode = shim.UnknownExitCode
	} else {
		state.Pid = r.Pid
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

// leftoverOp has an op process signal or delete a leftover. One that
// libcontainer no longer knows is fine when its records say it existed
// (it was removed already); else it is not found.
func (s *Server) leftoverOp(req *shim.OpRequest) error {
	r, err := s.runOp(req, nil, nil)
	if err != nil || !r.NotFound {
		return err
	}
	if st, ex, _ := shim.ReadRecords(shim.ContainerDir(s.dir, req.ID)); st != nil || ex != nil {
		return nil
	}
	return fmt.Errorf("%w: %s", shim.ErrNotFound, req.ID)
}

func (s *Server) killLeftover(id string, sig unix.Signal, all bool) error {
	return s.leftoverOp(&shim.OpRequest{Op: shim.OpKill, ID: id, Signal: int(sig), All: all})
}

func (s *Server) deleteLeftover(id string) error {
	return s.leftoverOp(&shim.OpRequest{Op: shim.OpDelete, ID: id})
}
