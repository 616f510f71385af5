package cri

import (
	"context"
	"errors"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/stats"
	"github.com/berth-runtime/berth/sandbox/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func (r *RuntimeService) ContainerStats(_ context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	c, err := r.pods.GetContainer(req.GetContainerId())
	if err != nil {
		return nil, grpcError(err)
	}
	st, ok, err := r.containerStats(c)
	if err != nil {
		return nil, grpcError(err)
	}
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is not running: it has no usage", c.ID)
	}
	return &runtimeapi.ContainerStatsResponse{Stats: st}, nil
}

// ListContainerStats reports the containers that have a cgroup (created or
// running ones). The node-wide list is kept, encoded, until
// stats.Collector.Version changes (see kept).
func (r *RuntimeService) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	f := containerStatsFilter(req.GetFilter())
	list := func() (*runtimeapi.ListContainerStatsResponse, bool, error) {
		stats, complete, err := r.listContainerStats(ctx, f)
		return &runtimeapi.ListContainerStatsResponse{Stats: stats}, complete, err
	}
	resp, err := r.allStats.answer(f, r.pods.Stats().Version(), list)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// listContainerStats is the entries of the containers f selects that have
// a cgroup; complete is false when one of them was unreadable.
func (r *RuntimeService) listContainerStats(ctx context.Context, f store.Filter) (stats []*runtimeapi.ContainerStats, complete bool, err error) {
	all, err := r.pods.ListContainers(ctx, f)
	if err != nil {
		return nil, false, err
	}
	stats, complete = make([]*runtimeapi.ContainerStats, 0, len(all)), true
	for _, c := range all {
		st, ok, readable := r.listedContainerStats(c.Container)
		if ok {
			stats = append(stats, st)
		}
		complete = complete && readable
	}
	return stats, complete, nil
}

// containerStatsMsgs is a container's stats message and every message it
// points to, so that they are made in one allocation.
type containerStatsMsgs struct {
	stats  runtimeapi.ContainerStats
	attrs  runtimeapi.ContainerAttributes
	cpu    cpuMsgs
	memory memoryMsgs
	swap   swapMsgs
	io     ioMsgs
	layer  runtimeapi.FilesystemUsage
	fsID   runtimeapi.FilesystemIdentifier
	used   [2]runtimeapi.UInt64Value
}

// listedContainerStats is one container's entry in a node- or pod-wide list:
// a container whose usage cannot be read is logged and listed without
// usage, so that it does not cost the kubelet every other container's
// figures (readable is false then).
func (r *RuntimeService) listedContainerStats(c *store.Container) (st *runtimeapi.ContainerStats, ok, readable bool) {
	st, ok, err := r.containerStats(c)
	if err != nil {
		r.cfg.Logger.Warn("container stats unreadable; listed without usage", "container", c.ID, "err", err)
		return &runtimeapi.ContainerStats{Attributes: containerAttributes(c, &runtimeapi.ContainerAttributes{})}, true, false
	}
	return st, ok, true
}

func containerAttributes(c *store.Container, a *runtimeapi.ContainerAttributes) *runtimeapi.ContainerAttributes {
	*a = runtimeapi.ContainerAttributes{Id: c.ID, Metadata: c.Config.Metadata, Labels: c.Config.Labels, Annotations: c.Config.Annotations}
	return a
}

// sampleStats is the stats message made of one sample of the collector,
// encoded (see encoded), and the writable layer's figures it holds.
type sampleStats struct {
	layerBytes, layerInodes uint64
	msg                     *runtimeapi.ContainerStats
}

// containerStats is c's stats message, already encoded. It is made and
// encoded once per sample of the collector and kept with the sample,
// shared by every call until the next one (a second later), unless the
// writable layer's figures, walked on their own time, changed meanwhile:
// callers (the kubelet's summary and its metrics, crictl) come more often
// than samples, and a node-wide list is some 900 bytes per container,
// whose encoding was most of such a call's time.
func (r *RuntimeService) containerStats(c *store.Container) (*runtimeapi.ContainerStats, bool, error) {
	u, ok, err := r.pods.Stats().ContainerUsage(c)
	if !ok || err != nil {
		return nil, ok, err
	}
	if s, _ := u.Memo.Load().(*sampleStats); s != nil && s.layerBytes == u.LayerBytes && s.layerInodes == u.LayerInodes {
		return s.msg, true, nil
	}
	m := &containerStatsMsgs{fsID: runtimeapi.FilesystemIdentifier{Mountpoint: u.LayerMountpoint}}
	m.used = [2]runtimeapi.UInt64Value{{Value: u.LayerBytes}, {Value: u.LayerInodes}}
	m.layer = runtimeapi.FilesystemUsage{Timestamp: u.Timestamp.UnixNano(), FsId: &m.fsID, UsedBytes: &m.used[0], InodesUsed: &m.used[1]}
	m.stats = runtimeapi.ContainerStats{
		Attributes:    containerAttributes(c, &m.attrs),
		Cpu:           m.cpu.fill(u),
		Memory:        m.memory.fill(u),
		Swap:          m.swap.fill(u),
		WritableLayer: &m.layer,
		Io:            m.io.fill(u),
	}
	msg, err := encoded(&m.stats)
	if err != nil {
		return nil, false, err
	}
	u.Memo.Store(&sampleStats{layerBytes: u.LayerBytes, layerInodes: u.LayerInodes, msg: msg})
	return msg, true, nil
}

// cpuMsgs is a CPU usage message and the values it points to.
type cpuMsgs struct {
	cpu    runtimeapi.CpuUsage
	values [2]runtimeapi.UInt64Value
	psi    psiMsgs
}

func (m *cpuMsgs) fill(u stats.Usage) *runtimeapi.CpuUsage {
	m.values = [2]runtimeapi.UInt64Value{{Value: u.CPUUsageNanos}, {Value: u.CPUNanoCores}}
	m.cpu = runtimeapi.CpuUsage{Timestamp: u.Timestamp.UnixNano(), UsageCoreNanoSeconds: &m.values[0], UsageNanoCores: &m.values[1],
		Psi: m.psi.fill(u.PSI.CPU)}
	return &m.cpu
}

// memoryMsgs is a memory usage message and the values it points to.
type memoryMsgs struct {
	memory runtimeapi.MemoryUsage
	values [6]runtimeapi.UInt64Value
	psi    psiMsgs
}

func (m *memoryMsgs) fill(u stats.Usage) *runtimeapi.MemoryUsage {
	v := &m.values
	*v = [6]runtimeapi.UInt64Value{{Value: u.MemoryWorkingSetBytes}, {Value: u.MemoryUsageBytes}, {Value: u.MemoryRSSBytes},
		{Value: u.PageFaults}, {Value: u.MajorPageFaults}}
	m.memory = runtimeapi.MemoryUsage{Timestamp: u.Timestamp.UnixNano(),
		WorkingSetBytes: &v[0], UsageBytes: &v[1], RssBytes: &v[2], PageFaults: &v[3], MajorPageFaults: &v[4],
		Psi: m.psi.fill(u.PSI.Memory)}
	// What the working set leaves of the limit, as the kubelet counts it
	// from cadvisor; none without a limit.
	if limit := u.MemoryLimitBytes; limit > 0 {
		v[5].Value = limit - min(limit, u.MemoryWorkingSetBytes)
		m.memory.AvailableBytes = &v[5]
	}
	return &m.memory
}

// swapMsgs is a swap usage message and the values it points to.
type swapMsgs struct {
	swap   runtimeapi.SwapUsage
	values [2]runtimeapi.UInt64Value
}

// fill is nil where the host does not account swap, and has no available
// swap where the cgroup's is not limited.
func (m *swapMsgs) fill(u stats.Usage) *runtimeapi.SwapUsage {
	s := u.Swap
	if !s.Accounted {
		return nil
	}
	m.values[0].Value = s.UsedBytes
	m.swap = runtimeapi.SwapUsage{Timestamp: u.Timestamp.UnixNano(), SwapUsageBytes: &m.values[0]}
	if s.Limited {
		m.values[1].Value = s.LimitBytes - min(s.LimitBytes, s.UsedBytes)
		m.swap.SwapAvailableBytes = &m.values[1]
	}
	return &m.swap
}

func (r *RuntimeService) PodSandboxStats(ctx context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	pod, err := r.pods.GetPod(req.GetPodSandboxId())
	if err != nil {
		return nil, grpcError(err)
	}
	st, err := r.podStats(ctx, pod)
	if err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.PodSandboxStatsResponse{Stats: st}, nil
}

func (r *RuntimeService) ListPodSandboxStats(ctx context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	pods, err := r.pods.ListPods(podStatsFilter(req.GetFilter()))
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &runtimeapi.ListPodSandboxStatsResponse{}
	for _, p := range pods {
		st, err := r.podStats(ctx, p)
		if errors.Is(err, errkind.NotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			// As for containers: one unreadable pod is listed without usage.
			r.cfg.Logger.Warn("pod stats unreadable; listed without usage", "pod", p.ID, "err", err)
			st = podStatsWithoutUsage(p)
		}
		resp.Stats = append(resp.Stats, st)
	}
	return resp, nil
}

func (r *RuntimeService) podStats(ctx context.Context, pod *store.Pod) (*runtimeapi.PodSandboxStats, error) {
	st := podStatsWithoutUsage(pod)
	u, ok, err := r.pods.Stats().PodUsage(pod)
	if err != nil {
		return nil, err
	}
	if ok {
		st.Linux.Cpu, st.Linux.Memory, st.Linux.Io = new(cpuMsgs).fill(u), new(memoryMsgs).fill(u), new(ioMsgs).fill(u)
		st.Linux.Process = &runtimeapi.ProcessUsage{Timestamp: u.Timestamp.UnixNano(), ProcessCount: &runtimeapi.UInt64Value{Value: u.Pids}}
	}
	// A network namespace not bound yet (a pod being set up) costs the pod
	// its network figures only, not its CPU, memory and containers.
	if st.Linux.Network, err = r.podNetworkStats(pod); err != nil {
		r.cfg.Logger.Warn("pod network stats unreadable; listed without them", "pod", pod.ID, "err", err)
	}
	ctrs, err := r.pods.ListContainers(ctx, store.Filter{PodID: pod.ID})
	if err != nil {
		return nil, err
	}
	for _, c := range ctrs {
		if cs, ok, _ := r.listedContainerStats(c.Container); ok {
			st.Linux.Containers = append(st.Linux.Containers, cs)
		}
	}
	return st, nil
}

// podStatsWithoutUsage is a pod's stats before any usage is filled in, and
// how a pod whose usage cannot be read is listed: an empty Linux message,
// not none, as the kubelet (1.37) reads its containers without a nil check
// and crashes on a nil one.
func podStatsWithoutUsage(pod *store.Pod) *runtimeapi.PodSandboxStats {
	return &runtimeapi.PodSandboxStats{Attributes: podAttributes(pod), Linux: &runtimeapi.LinuxPodSandboxStats{}}
}

func podAttributes(pod *store.Pod) *runtimeapi.PodSandboxAttributes {
	return &runtimeapi.PodSandboxAttributes{Id: pod.ID, Metadata: pod.Config.Metadata, Labels: pod.Config.Labels, Annotations: pod.Config.Annotations}
}

// podNetworkStats is the pod's interfaces for the kubelet's summary: its own
// interface (eth0) as the default, any others after it; nil for a pod with
// no network namespace of its own.
func (r *RuntimeService) podNetworkStats(pod *store.Pod) (*runtimeapi.NetworkUsage, error) {
	ifaces, ok, err := r.pods.Stats().PodNetworkUsage(pod)
	if !ok || err != nil || len(ifaces) == 0 {
		return nil, err
	}
	u := &runtimeapi.NetworkUsage{Timestamp: time.Now().UnixNano()}
	for i, s := range ifaces {
		iface := &runtimeapi.NetworkInterfaceUsage{Name: s.Name,
			RxBytes: &runtimeapi.UInt64Value{Value: s.RxBytes}, RxErrors: &runtimeapi.UInt64Value{Value: s.RxErrors},
			TxBytes: &runtimeapi.UInt64Value{Value: s.TxBytes}, TxErrors: &runtimeapi.UInt64Value{Value: s.TxErrors}}
		if i == 0 {
			u.DefaultInterface = iface
		} else {
			u.Interfaces = append(u.Interfaces, iface)
		}
	}
	return u, nil
}
