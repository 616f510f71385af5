package sandbox

import (
	"context"
	"errors"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// UpdateResources changes a created or running container's cgroup limits
// (the kubelet's in-place resize).
func (m *Manager) UpdateResources(ctx context.Context, id string, res *runtimeapi.LinuxContainerResources) error {
	specRes, err := cgroups.SpecResources(res, m.opts.Cgroups.Mode(), 0)
	if err != nil {
		return errkind.Errorf(errkind.Invalid, "linux: %v", err)
	}
	c, unlock, err := m.lockContainer(id)
	if err != nil {
		return err
	}
	defer unlock()
	pod, err := m.GetPod(c.PodID)
	if err != nil {
		return err
	}
	if specRes, err = m.opts.NRI.UpdateContainer(ctx, pod, m.nriContainer(c), specRes); err != nil {
		return err
	}
	if err := m.setResourcesLocked(ctx, c, specRes); err != nil {
		return err
	}
	m.opts.NRI.PostUpdateContainer(ctx, pod, m.nriContainer(c))
	return nil
}

// setResourcesLocked sets the container's limits in its cgroup and record.
func (m *Manager) setResourcesLocked(ctx context.Context, c *store.Container, specRes *specs.LinuxResources) error {
	client, err := m.podShim(c.PodID)
	if err == nil {
		err = client.Update(ctx, shim.UpdateRequest{ID: c.ID, Resources: specRes})
	}
	if errors.Is(err, shim.ErrNotRunning) || shim.IsNotFound(err) || errors.Is(err, shim.ErrUnavailable) {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running", c.ID)
	}
	if err != nil {
		return err
	}
	c.Resources = specRes // status shows them from the record
	return m.store.SaveContainer(c)
}

// UpdatePodResources records the pod-level resources of an in-place resize
// in the pod's config, once NRI plugins have had their say. The kubelet
// calls it after it has set the pod's cgroup itself, so berth writes no
// cgroup here: it keeps the config that PodSandboxStatus shows and a
// restarted berthd reads true. Resources the host could not honour are
// refused as they are at RunPodSandbox.
func (m *Manager) UpdatePodResources(ctx context.Context, id string, overhead, resources *runtimeapi.LinuxContainerResources) error {
	overheadSpec, err := m.podSpecResources("overhead", overhead)
	if err != nil {
		return err
	}
	resourcesSpec, err := m.podSpecResources("resources", resources)
	if err != nil {
		return err
	}
	pod, unlock, err := m.lockPod(id)
	if err != nil {
		return err
	}
	if pod == nil {
		return errkind.Errorf(errkind.NotFound, "pod %q", id)
	}
	defer unlock()
	if err := m.opts.NRI.UpdatePodSandbox(ctx, pod, overheadSpec, resourcesSpec); err != nil {
		return err
	}
	cfg := proto.CloneOf(pod.Config) // the store's config is shared with readers
	if cfg.Linux == nil {
		cfg.Linux = &runtimeapi.LinuxPodSandboxConfig{}
	}
	cfg.Linux.Overhead, cfg.Linux.Resources = overhead, resources
	pod.Config = cfg
	if err := m.store.SavePod(pod); err != nil {
		return err
	}
	m.opts.NRI.PostUpdatePodSandbox(ctx, pod)
	return nil
}

// podSpecResources is res, a pod-level field of UpdatePodSandboxResources,
// in the spec's form, or Invalid naming the field where the host could not
// honour it.
func (m *Manager) podSpecResources(field string, res *runtimeapi.LinuxContainerResources) (*specs.LinuxResources, error) {
	r, err := cgroups.SpecResources(res, m.opts.Cgroups.Mode(), 0)
	if err != nil {
		return nil, errkind.Errorf(errkind.Invalid, "%s: %v", field, err)
	}
	return r, nil
}
