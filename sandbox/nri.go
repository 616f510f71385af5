package sandbox

import (
	"context"
	"maps"
	"slices"

	"github.com/berth-runtime/berth/sandbox/nri"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// nriRuntime is what NRI plugins see of and change in the manager's pods
// and containers.
type nriRuntime struct{ m *Manager }

// Snapshot is every pod and container, as a plugin that connects sees them.
func (r nriRuntime) Snapshot(context.Context) ([]*api.PodSandbox, []*api.Container, error) {
	pods, err := r.m.store.ListPods(store.Filter{})
	if err != nil {
		return nil, nil, err
	}
	ctrs, err := r.m.store.ListStatuses(store.Filter{})
	if err != nil {
		return nil, nil, err
	}
	var ps []*api.PodSandbox
	for _, p := range pods {
		ps = append(ps, nri.PodOf(p))
	}
	var cs []*api.Container
	for _, c := range ctrs {
		cs = append(cs, nri.ContainerOf(nri.Container{Rec: c.Container, Spec: r.m.specOrNil(c.Container),
			State: nriState[c.State], Pid: c.Pid}))
	}
	return ps, cs, nil
}

// UpdateContainer sets the cgroup limits a plugin asked for, over those
// in force; the plugins are not asked about their own update.
func (r nriRuntime) UpdateContainer(ctx context.Context, id string, res *specs.LinuxResources) error {
	c, unlock, err := r.m.lockContainer(id)
	if err != nil {
		return err
	}
	defer unlock()
	merged := cloneResources(c.Resources)
	nri.MergeResources(merged, res)
	return r.m.setResourcesLocked(ctx, c, merged)
}

// cloneResources is a copy of r (the record's, shared with readers) deep
// enough for nri.MergeResources to change.
func cloneResources(r *specs.LinuxResources) *specs.LinuxResources {
	if r == nil {
		return &specs.LinuxResources{}
	}
	out := *r
	if r.CPU != nil {
		cpu := *r.CPU
		out.CPU = &cpu
	}
	if r.Memory != nil {
		mem := *r.Memory
		out.Memory = &mem
	}
	out.HugepageLimits = slices.Clone(r.HugepageLimits)
	out.Unified = maps.Clone(r.Unified)
	out.Devices = slices.Clone(r.Devices)
	return &out
}

var nriState = map[runtimeapi.ContainerState]api.ContainerState{
	runtimeapi.ContainerState_CONTAINER_CREATED: api.ContainerState_CONTAINER_CREATED,
	runtimeapi.ContainerState_CONTAINER_RUNNING: api.ContainerState_CONTAINER_RUNNING,
	runtimeapi.ContainerState_CONTAINER_EXITED:  api.ContainerState_CONTAINER_STOPPED,
}

var nriShimState = map[string]api.ContainerState{
	shim.StatusCreated: api.ContainerState_CONTAINER_CREATED,
	shim.StatusRunning: api.ContainerState_CONTAINER_RUNNING,
	shim.StatusStopped: api.ContainerState_CONTAINER_STOPPED,
}

// nriContainer is c as NRI plugins see it now.
func (m *Manager) nriContainer(c *store.Container) nri.Container {
	st := m.containerState(c)
	return nri.Container{Rec: c, Spec: m.specOrNil(c), State: nriShimState[st.Status], Pid: st.Pid}
}

// tellNRIStopped tells NRI plugins a container stopped, once: the shim's
// exit event and StopContainer both call it, whichever comes first tells,
// and the other waits until it has, so that a StopContainer returns only
// once plugins know (a RemoveContainer must not reach them first).
func (m *Manager) tellNRIStopped(podID, id string) {
	if m.opts.NRI == nil {
		return
	}
	done := make(chan struct{})
	if told, ok := m.nriStops.LoadOrStore(id, done); ok {
		<-told.(chan struct{})
		return
	}
	defer close(done)
	pod, err := m.GetPod(podID)
	if err != nil {
		return
	}
	if c, err := m.GetContainer(id); err == nil {
		m.opts.NRI.StopContainer(context.Background(), pod, m.nriContainer(c))
	}
}

// specOrNil is c's spec, or nil where it cannot be read: plugins then see
// the container as its record has it.
func (m *Manager) specOrNil(c *store.Container) *specs.Spec {
	s, err := m.readSpec(c)
	if err != nil || s.Process == nil {
		return nil
	}
	return s
}

// recordedResources are the limits of spec s, as the record keeps them
// (without the device rules, which the spec alone holds).
func recordedResources(s *specs.Spec) *specs.LinuxResources {
	if s.Linux == nil || s.Linux.Resources == nil {
		return nil
	}
	r := *s.Linux.Resources
	r.Devices = nil
	return &r
}
