// Package nri hosts Node Resource Interface plugins for the sandbox
// manager, through the protocol's runtime library: it tells them of each
// pod and container event, makes the adjustments they return to a
// container's spec (or refuses them, naming the one it cannot make), and
// carries out the updates they ask for through the Runtime. Evictions are
// not: the library (v0.12.5) never passes a plugin's on.
package nri

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus"
)

// Options are berthd's [nri] settings.
type Options struct {
	SocketPath          string
	PluginPath          string
	PluginConfigPath    string
	RegistrationTimeout time.Duration
	RequestTimeout      time.Duration
	DisableConnections  bool
	Version             string // berth's, told to plugins
	Logger              *slog.Logger
	Metrics             prometheus.Registerer // nil: none
	// CDI resolves the CDI devices plugins add to containers.
	CDI CDI
	// Cgroups refuses the limits plugins ask for that the host cannot set.
	Cgroups Cgroups
}

// Runtime is what plugins change of the node: the sandbox manager.
type Runtime interface {
	// Snapshot is every pod and container, for a plugin that connects.
	Snapshot(ctx context.Context) ([]*api.PodSandbox, []*api.Container, error)
	// UpdateContainer sets a container's cgroup limits.
	UpdateContainer(ctx context.Context, id string, res *specs.LinuxResources) error
}

// Host is berth's side of NRI. A nil Host is NRI off: its methods do
// nothing.
type Host struct {
	a   *adaptation.Adaptation
	rt  Runtime
	cdi CDI
	cg  Cgroups
	log *slog.Logger
}

// followUpTimeout bounds the updates a plugin asked for
// while answering an event.
const followUpTimeout = time.Minute

// New sets up NRI hosting with o; Start begins it.
func New(o Options) (*Host, error) {
	h := &Host{log: o.Logger, cdi: o.CDI, cg: o.Cgroups}
	nrilog.Set(logger{o.Logger})
	adaptation.SetPluginRegistrationTimeout(o.RegistrationTimeout)
	adaptation.SetPluginRequestTimeout(o.RequestTimeout)
	opts := []adaptation.Option{adaptation.WithPluginPath(o.PluginPath), adaptation.WithPluginConfigPath(o.PluginConfigPath),
		adaptation.WithSocketPath(o.SocketPath), adaptation.WithMetrics(newMetrics(o.Metrics))}
	if o.DisableConnections {
		opts = append(opts, adaptation.WithDisabledExternalConnections())
	}
	a, err := adaptation.New("berth", o.Version, h.synchronize, h.updateContainers, opts...)
	if err != nil {
		return nil, fmt.Errorf("nri: %w", err)
	}
	h.a = a
	return h, nil
}

// Start starts the plugins of the plugin path and listens for others:
// from here on they change rt's containers.
func (h *Host) Start(rt Runtime) error {
	if h == nil {
		return nil
	}
	h.rt = rt
	if err := h.a.Start(); err != nil {
		return fmt.Errorf("nri: %w", err)
	}
	return nil
}

// Stop stops the plugins berthd started and closes the socket.
func (h *Host) Stop() {
	if h != nil {
		h.a.Stop()
	}
}

// BlockSync keeps plugins that connect from synchronising until the
// returned function is called: a pod or container made meanwhile is in
// their snapshot or told to them as an event, never neither.
func (h *Host) BlockSync() func() {
	if h == nil {
		return func() {}
	}
	return h.a.BlockPluginSync().Unblock
}

// synchronize gives a connecting plugin every pod and container, and
// carries out the updates it answers with.
func (h *Host) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
	pods, ctrs, err := h.rt.Snapshot(ctx)
	if err != nil {
		return err
	}
	updates, err := cb(ctx, pods, ctrs)
	if err != nil {
		return err
	}
	// Not under the sync: the updates take pod locks that an event blocked
	// on the sync may hold.
	h.followUp(updates)
	return nil
}

// updateContainers carries out a plugin's unsolicited updates, and
// returns those that failed.
func (h *Host) updateContainers(ctx context.Context, updates []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
	var failed []*api.ContainerUpdate
	for _, u := range updates {
		res := u.GetLinux().GetResources().ToOCI()
		err := refuseUnhonourable(h.cg, "update", res)
		if err == nil {
			err = h.rt.UpdateContainer(ctx, u.ContainerId, res)
		}
		if err != nil {
			h.log.Warn("NRI: update container", "container", u.ContainerId, "err", err)
			if !u.IgnoreFailure {
				failed = append(failed, u)
			}
		}
	}
	return failed, nil
}

// followUp carries out, in the background, the updates of other
// containers a plugin asked for while answering an event: their pods may
// be locked by the caller. The evictions the protocol also defines never
// come: the library (v0.12.5) leaves them out of its answers.
func (h *Host) followUp(updates []*api.ContainerUpdate) {
	if len(updates) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), followUpTimeout)
		defer cancel()
		if _, err := h.updateContainers(ctx, updates); err != nil {
			h.log.Warn("NRI: update containers", "err", err)
		}
	}()
}

// Container is a container as plugins see it: its record, its spec (nil
// where it cannot be read) and its live state.
type Container struct {
	Rec   *store.Container
	Spec  *specs.Spec
	State api.ContainerState
	Pid   int
}

// RunPodSandbox tells plugins of a pod made ready.
func (h *Host) RunPodSandbox(ctx context.Context, pod *store.Pod) error {
	if h == nil {
		return nil
	}
	return refused(h.a.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: PodOf(pod)}))
}

// StopPodSandbox tells plugins of a pod stopped.
func (h *Host) StopPodSandbox(ctx context.Context, pod *store.Pod) {
	if h != nil {
		h.logged("stop pod", h.a.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: PodOf(pod)}))
	}
}

// RemovePodSandbox tells plugins of a pod removed.
func (h *Host) RemovePodSandbox(ctx context.Context, pod *store.Pod) {
	if h != nil {
		h.logged("remove pod", h.a.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: PodOf(pod)}))
	}
}

// UpdatePodSandbox asks plugins for their say on a pod's new resources,
// its overhead and its containers' sum; a refusal fails the update.
func (h *Host) UpdatePodSandbox(ctx context.Context, pod *store.Pod, overhead, resources *specs.LinuxResources) error {
	if h == nil {
		return nil
	}
	_, err := h.a.UpdatePodSandbox(ctx, &api.UpdatePodSandboxRequest{Pod: PodOf(pod),
		OverheadLinuxResources: api.FromOCILinuxResources(overhead, nil), LinuxResources: api.FromOCILinuxResources(resources, nil)})
	return refused(err)
}

// PostUpdatePodSandbox tells plugins of a pod's resources changed.
func (h *Host) PostUpdatePodSandbox(ctx context.Context, pod *store.Pod) {
	if h != nil {
		h.logged("post-update pod", h.a.PostUpdatePodSandbox(ctx, &api.PostUpdatePodSandboxRequest{Pod: PodOf(pod)}))
	}
}

// CreateContainer asks plugins for their adjustment of a container's spec
// s, and makes it in s; a plugin's refusal, or an adjustment berth cannot
// make, fails the create.
func (h *Host) CreateContainer(ctx context.Context, pod *store.Pod, c Container) error {
	if h == nil {
		return nil
	}
	rpl, err := h.a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c)})
	if err != nil {
		return refused(err)
	}
	if err := Adjust(c.Spec, rpl.GetAdjust(), h.cdi, h.cg); err != nil {
		return err
	}
	h.followUp(rpl.GetUpdate())
	return nil
}

// PostCreateContainer tells plugins of a container created.
func (h *Host) PostCreateContainer(ctx context.Context, pod *store.Pod, c Container) {
	if h != nil {
		h.logged("post-create container", h.a.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c)}))
	}
}

// StartContainer tells plugins a container is about to start; a refusal
// fails the start.
func (h *Host) StartContainer(ctx context.Context, pod *store.Pod, c Container) error {
	if h == nil {
		return nil
	}
	return refused(h.a.StartContainer(ctx, &api.StartContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c)}))
}

// PostStartContainer tells plugins of a container started.
func (h *Host) PostStartContainer(ctx context.Context, pod *store.Pod, c Container) {
	if h != nil {
		h.logged("post-start container", h.a.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c)}))
	}
}

// UpdateContainer asks plugins for their say on new limits res of a
// container, and returns the limits to set.
func (h *Host) UpdateContainer(ctx context.Context, pod *store.Pod, c Container, res *specs.LinuxResources) (*specs.LinuxResources, error) {
	if h == nil {
		return res, nil
	}
	rpl, err := h.a.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c),
		LinuxResources: api.FromOCILinuxResources(res, nil)})
	if err != nil {
		return nil, refused(err)
	}
	var others []*api.ContainerUpdate
	for _, u := range rpl.GetUpdate() {
		switch {
		case u == nil: // the library's entry for c when no plugin changed it
		case u.ContainerId == c.Rec.ID:
			own := u.GetLinux().GetResources().ToOCI()
			if err := refuseUnhonourable(h.cg, "update", own); err != nil {
				return nil, err
			}
			MergeResources(res, own)
		default:
			others = append(others, u)
		}
	}
	h.followUp(others)
	return res, nil
}

// PostUpdateContainer tells plugins of a container's limits changed.
func (h *Host) PostUpdateContainer(ctx context.Context, pod *store.Pod, c Container) {
	if h != nil {
		h.logged("post-update container", h.a.PostUpdateContainer(ctx, &api.PostUpdateContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c)}))
	}
}

// StopContainer tells plugins of a container stopped, and carries out the
// updates of others they answer with.
func (h *Host) StopContainer(ctx context.Context, pod *store.Pod, c Container) {
	if h == nil {
		return
	}
	rpl, err := h.a.StopContainer(ctx, &api.StopContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c)})
	h.logged("stop container", err)
	h.followUp(rpl.GetUpdate())
}

// RemoveContainer tells plugins of a container removed.
func (h *Host) RemoveContainer(ctx context.Context, pod *store.Pod, c Container) {
	if h != nil {
		h.logged("remove container", h.a.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: PodOf(pod), Container: ContainerOf(c)}))
	}
}

// refused marks a plugin's refusal: the request's, not berth's fault.
func refused(err error) error {
	if err == nil {
		return nil
	}
	return errkind.Errorf(errkind.FailedPrecondition, "NRI: %v", err)
}

// logged logs a plugin's failure on an event that has happened whatever
// plugins say.
func (h *Host) logged(event string, err error) {
	if err != nil {
		h.log.Warn("NRI plugin failed", "event", event, "err", err)
	}
}
