package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
)

// ExecSync runs cmd in a running container and returns its output and exit
// code. A timeout kills the command and what it started. Output beyond
// shim.DefaultMaxOutput is discarded; the command runs to its end.
func (m *Manager) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) (shim.ExecResponse, error) {
	c, err := m.GetContainer(id)
	if err != nil {
		return shim.ExecResponse{}, err
	}
	client, err := m.podShim(c.PodID)
	if err != nil {
		return shim.ExecResponse{}, errkind.Errorf(errkind.FailedPrecondition, "container %s is not running: %v", c.ID, err)
	}
	res, err := client.Exec(ctx, shim.ExecRequest{ID: c.ID, Args: cmd, Timeout: timeout})
	switch {
	case errors.Is(err, shim.ErrNotRunning), shim.IsNotFound(err):
		return res, errkind.Errorf(errkind.FailedPrecondition, "container %s is not running", c.ID)
	case errors.Is(err, shim.ErrOutputTooLarge), // a shim from before the excess was discarded
		errors.Is(err, shim.ErrPidsLimit):
		return res, errkind.Errorf(errkind.ResourceExhausted, "exec in container %s: %v", c.ID, err)
	case err == nil && res.TimedOut:
		return res, errkind.Errorf(errkind.DeadlineExceeded, "exec in container %s: command timed out after %s and was killed", c.ID, timeout)
	}
	return res, err
}

// ReopenLog makes the shim reopen the container's log file after the
// kubelet rotated it.
func (m *Manager) ReopenLog(ctx context.Context, id string) error {
	c, err := m.GetContainer(id)
	if err != nil {
		return err
	}
	client, err := m.podShim(c.PodID)
	if err == nil {
		err = client.ReopenLog(ctx, c.ID)
	}
	if errors.Is(err, shim.ErrNotRunning) || shim.IsNotFound(err) || errors.Is(err, shim.ErrUnavailable) {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running", c.ID)
	}
	return err
}
