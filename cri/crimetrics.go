package cri

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/network"
	"github.com/berth-runtime/berth/sandbox/stats"
	"github.com/berth-runtime/berth/sandbox/store"
)

// The CRI metrics (ListMetricDescriptors, ListPodSandboxMetrics) are what
// the kubelet serves on /metrics/cadvisor when PodAndContainerStatsFromCRI
// is on: cAdvisor's names, so that dashboards and alerts keep working, and
// its labels, with pod, namespace and container filled in.

// criLabels are every container series' labels, in this order: id (the
// container's or pod's ID), name (the container's name), image, pod,
// namespace, container. A series may have more after them (its metric's
// labels).
var criLabels = []string{"id", "name", "image", "pod", "namespace", "container"}

// netLabels are the pod network series' labels.
var netLabels = append(append([]string{}, criLabels...), "interface")

// criMetric is a container series: add is called with each of its values
// and the values of its labels beyond criLabels, once per value it has,
// and not at all where the host does not know it (stats.ContainerDetails
// says which figures it read). The descriptors list every series, so that
// the kubelet knows them all; a container only carries those with values.
type criMetric struct {
	name, help string
	kind       runtimeapi.MetricType
	labels     []string
	values     func(d *containerFigures, add func(v uint64, labels ...string))
}

// containerFigures are what a container's series are made of.
type containerFigures struct {
	stats.ContainerDetails
	startedAt, now time.Time
}

// one is a series of one value, always known.
func one(f func(d *containerFigures) uint64) func(*containerFigures, func(uint64, ...string)) {
	return func(d *containerFigures, add func(uint64, ...string)) { add(f(d)) }
}

// when is a series of one value, known where has says so.
func when(has func(d *containerFigures) bool, f func(d *containerFigures) uint64) func(*containerFigures, func(uint64, ...string)) {
	return func(d *containerFigures, add func(uint64, ...string)) {
		if has(d) {
			add(f(d))
		}
	}
}

func hasCPUSpec(d *containerFigures) bool    { return d.Has.CPUSpec }
func hasMemorySpec(d *containerFigures) bool { return d.Has.MemorySpec }
func hasPids(d *containerFigures) bool       { return d.Has.Pids }

// hasQuota: the CFS counters count only while a CPU quota is set, and
// cadvisor reports them only then.
func hasQuota(d *containerFigures) bool { return d.Has.CPUSpec && d.Spec.CPUQuotaMicros != 0 }

// perDevice is a series of each block device the container did I/O on.
func perDevice(f func(io *cgroups.DeviceIO) uint64) func(*containerFigures, func(uint64, ...string)) {
	return func(d *containerFigures, add func(uint64, ...string)) {
		for i := range d.IO {
			add(f(&d.IO[i]), d.IO[i].Device)
		}
	}
}

// onLayerFs is a series of the writable layer's filesystem, by its device.
func onLayerFs(f func(d *containerFigures) uint64) func(*containerFigures, func(uint64, ...string)) {
	return func(d *containerFigures, add func(uint64, ...string)) { add(f(d), d.Fs.Device) }
}

var (
	device         = []string{"device"}
	counter        = runtimeapi.MetricType_COUNTER
	gauge          = runtimeapi.MetricType_GAUGE
	nanosPerSecond = uint64(time.Second)
)

// containerMetrics are cadvisor's container series, by its names, labels
// and meanings (its metrics/prometheus.go); where a figure comes from is
// in cgroups.Details and stats.ContainerDetails. The CRI carries whole
// numbers only: seconds are whole seconds.
var containerMetrics = []criMetric{
	{"container_cpu_usage_seconds_total", "Cumulative CPU time consumed, in whole seconds.", counter, nil,
		one(func(d *containerFigures) uint64 { return d.CPUUsageNanos / nanosPerSecond })},
	{"container_cpu_user_seconds_total", "Cumulative CPU time consumed in user mode, in whole seconds.", counter, nil,
		one(func(d *containerFigures) uint64 { return d.CPUUserNanos / nanosPerSecond })},
	{"container_cpu_system_seconds_total", "Cumulative CPU time consumed in kernel mode, in whole seconds.", counter, nil,
		one(func(d *containerFigures) uint64 { return d.CPUSystemNanos / nanosPerSecond })},
	{"container_cpu_cfs_periods_total", "Number of CFS enforcement periods elapsed while a CPU quota is set.", counter, nil,
		when(hasQuota, func(d *containerFigures) uint64 { return d.CFSPeriods })},
	{"container_cpu_cfs_throttled_periods_total", "Number of CFS periods in which the container was throttled.", counter, nil,
		when(hasQuota, func(d *containerFigures) uint64 { return d.CFSThrottledPeriods })},
	{"container_cpu_cfs_throttled_seconds_total", "Total time the container was throttled, in whole seconds.", counter, nil,
		when(hasQuota, func(d *containerFigures) uint64 { return d.CFSThrottledNanos / nanosPerSecond })},
	{"container_memory_usage_bytes", "Current memory usage, including all memory regardless of when it was accessed.", gauge, nil,
		one(func(d *containerFigures) uint64 { return d.MemoryUsageBytes })},
	{"container_memory_working_set_bytes", "Current working set (usage less inactive file pages).", gauge, nil,
		one(func(d *containerFigures) uint64 { return d.MemoryWorkingSetBytes })},
	{"container_memory_max_usage_bytes", "Highest memory usage recorded.", gauge, nil,
		when(func(d *containerFigures) bool { return d.Has.MemoryPeak }, func(d *containerFigures) uint64 { return d.MemoryMaxUsageBytes })},
	{"container_memory_rss", "Size of RSS (anonymous memory).", gauge, nil,
		one(func(d *containerFigures) uint64 { return d.MemoryRSSBytes })},
	{"container_memory_cache", "Page cache memory.", gauge, nil,
		one(func(d *containerFigures) uint64 { return d.MemoryCacheBytes })},
	{"container_memory_mapped_file", "Size of memory-mapped files.", gauge, nil,
		one(func(d *containerFigures) uint64 { return d.MemoryMappedFileBytes })},
	{"container_memory_kernel_usage", "Kernel memory charged to the container.", gauge, nil,
		when(func(d *containerFigures) bool { return d.Has.KernelMemory }, func(d *containerFigures) uint64 { return d.MemoryKernelBytes })},
	{"container_memory_swap", "Swap used by the container.", gauge, nil,
		when(func(d *containerFigures) bool { return d.Swap.Accounted }, func(d *containerFigures) uint64 { return d.Swap.UsedBytes })},
	{"container_memory_failcnt", "Number of times memory usage hit the limit.", counter, nil,
		when(hasMemorySpec, func(d *containerFigures) uint64 { return d.MemoryFailcnt })},
	// A container's cgroup has no children: its own page faults are its
	// hierarchy's, and cadvisor reports the one figure for both scopes.
	{"container_memory_failures_total", "Cumulative count of memory allocation failures (page faults), by type and scope.", counter,
		[]string{"failure_type", "scope"},
		func(d *containerFigures, add func(uint64, ...string)) {
			for _, scope := range []string{"container", "hierarchy"} {
				add(d.PageFaults, "pgfault", scope)
				add(d.MajorPageFaults, "pgmajfault", scope)
			}
		}},
	{"container_oom_events_total", "Count of out of memory events observed for the container.", counter, nil,
		one(func(d *containerFigures) uint64 { return d.OOMKills })},
	{"container_processes", "Number of processes running inside the container.", gauge, nil,
		one(func(d *containerFigures) uint64 { return uint64(len(d.Procs)) })},
	{"container_threads", "Number of threads running inside the container.", gauge, nil,
		when(hasPids, func(d *containerFigures) uint64 { return d.Pids })},
	{"container_threads_max", "Maximum number of threads allowed inside the container; 0 is no limit.", gauge, nil,
		when(hasPids, func(d *containerFigures) uint64 { return d.PidsLimit })},
	{"container_file_descriptors", "Number of open file descriptors of the container's processes.", gauge, nil,
		one(func(d *containerFigures) uint64 { return d.FileDescriptors })},
	{"container_sockets", "Number of open sockets of the container's processes.", gauge, nil,
		one(func(d *containerFigures) uint64 { return d.Sockets })},
	{"container_fs_usage_bytes", "Bytes used by the container's writable layer.", gauge, device,
		onLayerFs(func(d *containerFigures) uint64 { return d.LayerBytes })},
	{"container_fs_inodes_total", "Inodes used by the container's writable layer.", gauge, device,
		onLayerFs(func(d *containerFigures) uint64 { return d.LayerInodes })},
	{"container_fs_limit_bytes", "Size of the filesystem of the container's writable layer: the bytes it can use.", gauge, device,
		onLayerFs(func(d *containerFigures) uint64 { return d.Fs.LimitBytes })},
	{"container_fs_inodes_free", "Free inodes of the filesystem of the container's writable layer.", gauge, device,
		onLayerFs(func(d *containerFigures) uint64 { return d.Fs.InodesFree })},
	{"container_fs_reads_bytes_total", "Cumulative count of bytes read, per block device.", counter, device,
		perDevice(func(io *cgroups.DeviceIO) uint64 { return io.ReadBytes })},
	{"container_fs_reads_total", "Cumulative count of reads completed, per block device.", counter, device,
		perDevice(func(io *cgroups.DeviceIO) uint64 { return io.Reads })},
	{"container_fs_writes_bytes_total", "Cumulative count of bytes written, per block device.", counter, device,
		perDevice(func(io *cgroups.DeviceIO) uint64 { return io.WriteBytes })},
	{"container_fs_writes_total", "Cumulative count of writes completed, per block device.", counter, device,
		perDevice(func(io *cgroups.DeviceIO) uint64 { return io.Writes })},
	{"container_blkio_device_usage_total", "Bytes of block I/O, per device and operation (Read, Write).", counter,
		[]string{"device", "major", "minor", "operation"},
		func(d *containerFigures, add func(uint64, ...string)) {
			for _, io := range d.IO {
				major, minor := strconv.FormatUint(uint64(io.Major), 10), strconv.FormatUint(uint64(io.Minor), 10)
				add(io.ReadBytes, io.Device, major, minor, "Read")
				add(io.WriteBytes, io.Device, major, minor, "Write")
			}
		}},
	{"container_spec_cpu_period", "CPU period of the container, in microseconds.", gauge, nil,
		when(hasCPUSpec, func(d *containerFigures) uint64 { return d.Spec.CPUPeriodMicros })},
	{"container_spec_cpu_quota", "CPU quota of the container, in microseconds per period.", gauge, nil,
		when(hasQuota, func(d *containerFigures) uint64 { return d.Spec.CPUQuotaMicros })},
	{"container_spec_cpu_shares", "CPU shares of the container.", gauge, nil,
		when(hasCPUSpec, func(d *containerFigures) uint64 { return d.Spec.CPUShares })},
	{"container_spec_memory_limit_bytes", "Memory limit of the container; 0 is none.", gauge, nil,
		when(hasMemorySpec, func(d *containerFigures) uint64 { return d.MemoryLimitBytes })},
	{"container_spec_memory_swap_limit_bytes", "Swap limit of the container (cgroup v1: memory and swap together); 0 is none.", gauge, nil,
		when(func(d *containerFigures) bool { return d.Has.SwapLimit }, func(d *containerFigures) uint64 { return d.Spec.MemorySwapLimitBytes })},
	{"container_start_time_seconds", "Start time of the container, in seconds since the Unix epoch.", gauge, nil,
		one(func(d *containerFigures) uint64 { return uint64(d.startedAt.Unix()) })},
	{"container_last_seen", "Last time the container was seen by berth, in seconds since the Unix epoch.", gauge, nil,
		one(func(d *containerFigures) uint64 { return uint64(d.now.Unix()) })},
}

type netMetric struct {
	name, help string
	value      func(s *network.InterfaceStats) uint64
}

// podMetrics are the pod's network counters, per interface in its namespace.
var podMetrics = []netMetric{
	{"container_network_receive_bytes_total", "Cumulative count of bytes received.", func(s *network.InterfaceStats) uint64 { return s.RxBytes }},
	{"container_network_receive_packets_total", "Cumulative count of packets received.", func(s *network.InterfaceStats) uint64 { return s.RxPackets }},
	{"container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving.", func(s *network.InterfaceStats) uint64 { return s.RxDrops }},
	{"container_network_receive_errors_total", "Cumulative count of errors encountered while receiving.", func(s *network.InterfaceStats) uint64 { return s.RxErrors }},
	{"container_network_transmit_bytes_total", "Cumulative count of bytes transmitted.", func(s *network.InterfaceStats) uint64 { return s.TxBytes }},
	{"container_network_transmit_packets_total", "Cumulative count of packets transmitted.", func(s *network.InterfaceStats) uint64 { return s.TxPackets }},
	{"container_network_transmit_packets_dropped_total", "Cumulative count of packets dropped while transmitting.", func(s *network.InterfaceStats) uint64 { return s.TxDrops }},
	{"container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting.", func(s *network.InterfaceStats) uint64 { return s.TxErrors }},
}

func (r *RuntimeService) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	resp := &runtimeapi.ListMetricDescriptorsResponse{}
	for _, m := range containerMetrics {
		keys := append(append([]string{}, criLabels...), m.labels...)
		resp.Descriptors = append(resp.Descriptors, &runtimeapi.MetricDescriptor{Name: m.name, Help: m.help, LabelKeys: keys})
	}
	for _, m := range podMetrics {
		resp.Descriptors = append(resp.Descriptors, &runtimeapi.MetricDescriptor{Name: m.name, Help: m.help, LabelKeys: netLabels})
	}
	return resp, nil
}

// ListPodSandboxMetrics reports every ready pod: its network counters and
// its running containers' usage, read through the same sandbox calls as
// the stats calls.
func (r *RuntimeService) ListPodSandboxMetrics(ctx context.Context, _ *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	resp := &runtimeapi.ListPodSandboxMetricsResponse{}
	err := r.eachPodMetrics(ctx, func(pm *runtimeapi.PodSandboxMetrics) error {
		resp.PodMetrics = append(resp.PodMetrics, pm)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// StreamPodSandboxMetrics is ListPodSandboxMetrics one pod per message, so
// that no node is too big for one gRPC message.
func (r *RuntimeService) StreamPodSandboxMetrics(_ *runtimeapi.StreamPodSandboxMetricsRequest, s grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxMetricsResponse]) error {
	return r.eachPodMetrics(s.Context(), func(pm *runtimeapi.PodSandboxMetrics) error {
		return s.Send(&runtimeapi.StreamPodSandboxMetricsResponse{PodSandboxMetrics: []*runtimeapi.PodSandboxMetrics{pm}})
	})
}

// eachPodMetrics hands each ready pod's metrics to send. A pod or container
// whose figures cannot be read is logged and left out, as in
// ListPodSandboxStats.
func (r *RuntimeService) eachPodMetrics(ctx context.Context, send func(*runtimeapi.PodSandboxMetrics) error) error {
	pods, err := r.pods.ListPods(store.Filter{})
	if err != nil {
		return grpcError(err)
	}
	for _, p := range pods {
		if p.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			continue
		}
		pm, err := r.podMetrics(ctx, p)
		if errors.Is(err, errkind.NotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			r.cfg.Logger.Warn("pod metrics unreadable; left out", "pod", p.ID, "err", err)
			continue
		}
		if err := send(pm); err != nil {
			return err
		}
	}
	return nil
}

func (r *RuntimeService) podMetrics(ctx context.Context, p *store.Pod) (*runtimeapi.PodSandboxMetrics, error) {
	md := p.Config.GetMetadata()
	pm := &runtimeapi.PodSandboxMetrics{PodSandboxId: p.ID}
	ifaces, _, err := r.pods.Stats().PodNetworkUsage(p)
	if err != nil {
		return nil, err
	}
	for i := range ifaces {
		labels := []string{p.ID, "", "", md.GetName(), md.GetNamespace(), "", ifaces[i].Name}
		for _, m := range podMetrics {
			pm.Metrics = append(pm.Metrics, &runtimeapi.Metric{Name: m.name, MetricType: runtimeapi.MetricType_COUNTER,
				LabelValues: labels, Value: &runtimeapi.UInt64Value{Value: m.value(&ifaces[i])}})
		}
	}
	ctrs, err := r.pods.ListContainers(ctx, store.Filter{PodID: p.ID})
	if err != nil {
		return nil, err
	}
	for _, c := range ctrs {
		if c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		d, ok, err := r.pods.Stats().ContainerDetails(c.Container)
		if err != nil {
			r.cfg.Logger.Warn("container metrics unreadable; left out", "container", c.ID, "err", err)
			continue
		}
		if !ok {
			continue
		}
		name := c.Config.GetMetadata().GetName()
		labels := []string{c.ID, name, cmp.Or(c.ImageName, c.ImageRef), md.GetName(), md.GetNamespace(), name}
		cm := &runtimeapi.ContainerMetrics{ContainerId: c.ID}
		// The figures are read now, each container's at its own time,
		// which goes with them. (The network's are read now too: time 0,
		// which the kubelet takes as read on request.)
		figures := &containerFigures{ContainerDetails: d, startedAt: c.StartedAt, now: time.Now()}
		ts := d.Timestamp.UnixNano()
		for _, m := range containerMetrics {
			m.values(figures, func(v uint64, extra ...string) {
				cm.Metrics = append(cm.Metrics, &runtimeapi.Metric{Name: m.name, Timestamp: ts, MetricType: m.kind,
					LabelValues: append(labels[:len(labels):len(labels)], extra...), Value: &runtimeapi.UInt64Value{Value: v}})
			})
		}
		pm.ContainerMetrics = append(pm.ContainerMetrics, cm)
	}
	return pm, nil
}
