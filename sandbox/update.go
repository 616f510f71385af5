package sandbox

import (
	"context"
	"errors"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// UpdateResources changes a created or running container's cgroup limits
// (the kubelet's in-place resize).
func (m *Manager) UpdateResources(ctx context.Context, id string, res *runtimeapi.LinuxContainerResources) error {
	c, unlock, err := m.lockContainer(id)
	if err != nil {
		return err
	}
	defer unlock()
	specRes, err := cgroups.SpecResources(res, m.opts.Cgroups.Mode(), 0)
	if err != nil {
		return errkind.Errorf(errkind.Invalid, "linux: %v", err)
	}
	client, err := m.podShim(c.PodID)
	if err == nil {
		err = client.Update(ctx, shim.UpdateRequest{ID: c.ID, Resources: specRes})
	}
	if errors.Is(err, shim.ErrNotRunning) || shim.IsNotFound(err) || errors.Is(err, shim.ErrUnavailable) {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running", c.ID)
	}
	return err
}
