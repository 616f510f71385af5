package cri

import (
	"cmp"
	"context"
	"errors"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/stats"
	"github.com/berth-runtime/berth/sandbox/store"
)

// The CRI metrics (ListMetricDescriptors, ListPodSandboxMetrics) are what
// the kubelet serves on /metrics/cadvisor when PodAndContainerStatsFromCRI
// is on: cAdvisor's names, so that dashboards and alerts keep working, and
// its labels, with pod, namespace and container filled in.

// criLabels are every container series' labels, in this order: id (the
// container's or pod's ID), name (the container's name), image, pod,
// namespace, container.
var criLabels = []string{"id", "name", "image", "pod", "namespace", "container"}

// netLabels are the pod network series' labels.
var netLabels = append(append([]string{}, criLabels...), "interface")

type criMetric struct {
	name, help string
	kind       runtimeapi.MetricType
	value      func(stats.Usage) uint64
}

// containerMetrics are read from a container's cgroup and writable layer.
// The CRI carries whole numbers only: CPU seconds are whole seconds.
var containerMetrics = []criMetric{
	{"container_cpu_usage_seconds_total", "Cumulative CPU time consumed, in whole seconds.", runtimeapi.MetricType_COUNTER,
		func(u stats.Usage) uint64 { return u.CPUUsageNanos / 1e9 }},
	{"container_memory_usage_bytes", "Current memory usage, including all memory regardless of when it was accessed.", runtimeapi.MetricType_GAUGE,
		func(u stats.Usage) uint64 { return u.MemoryUsageBytes }},
	{"container_memory_working_set_bytes", "Current working set (usage less inactive file pages).", runtimeapi.MetricType_GAUGE,
		func(u stats.Usage) uint64 { return u.MemoryWorkingSetBytes }},
	{"container_memory_rss", "Size of RSS (anonymous memory).", runtimeapi.MetricType_GAUGE,
		func(u stats.Usage) uint64 { return u.MemoryRSSBytes }},
	{"container_memory_cache", "Page cache memory.", runtimeapi.MetricType_GAUGE,
		func(u stats.Usage) uint64 { return u.MemoryCacheBytes }},
	{"container_oom_events_total", "Count of out of memory events observed for the container.", runtimeapi.MetricType_COUNTER,
		func(u stats.Usage) uint64 { return u.OOMKills }},
	{"container_processes", "Number of processes running inside the container.", runtimeapi.MetricType_GAUGE,
		func(u stats.Usage) uint64 { return u.Pids }},
	{"container_fs_usage_bytes", "Bytes used by the container's writable layer.", runtimeapi.MetricType_GAUGE,
		func(u stats.Usage) uint64 { return u.LayerBytes }},
	{"container_fs_inodes_total", "Inodes used by the container's writable layer.", runtimeapi.MetricType_GAUGE,
		func(u stats.Usage) uint64 { return u.LayerInodes }},
}

type netMetric struct {
	name, help string
	value      func(s ifaceStats) uint64
}

type ifaceStats struct{ rxBytes, rxErrors, txBytes, txErrors uint64 }

// podMetrics are the pod's network counters, per interface in its namespace.
var podMetrics = []netMetric{
	{"container_network_receive_bytes_total", "Cumulative count of bytes received.", func(s ifaceStats) uint64 { return s.rxBytes }},
	{"container_network_receive_errors_total", "Cumulative count of errors encountered while receiving.", func(s ifaceStats) uint64 { return s.rxErrors }},
	{"container_network_transmit_bytes_total", "Cumulative count of bytes transmitted.", func(s ifaceStats) uint64 { return s.txBytes }},
	{"container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting.", func(s ifaceStats) uint64 { return s.txErrors }},
}

func (r *RuntimeService) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	resp := &runtimeapi.ListMetricDescriptorsResponse{}
	for _, m := range containerMetrics {
		resp.Descriptors = append(resp.Descriptors, &runtimeapi.MetricDescriptor{Name: m.name, Help: m.help, LabelKeys: criLabels})
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
	for _, s := range ifaces {
		st := ifaceStats{rxBytes: s.RxBytes, rxErrors: s.RxErrors, txBytes: s.TxBytes, txErrors: s.TxErrors}
		labels := []string{p.ID, "", "", md.GetName(), md.GetNamespace(), "", s.Name}
		for _, m := range podMetrics {
			pm.Metrics = append(pm.Metrics, &runtimeapi.Metric{Name: m.name, MetricType: runtimeapi.MetricType_COUNTER,
				LabelValues: labels, Value: &runtimeapi.UInt64Value{Value: m.value(st)}})
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
		u, ok, err := r.pods.Stats().ContainerUsage(c.Container)
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
		// The figures are the collector's sample, up to a period old: its
		// time goes with them. (The network's are read now: time 0, which
		// the kubelet takes as read on request.)
		for _, m := range containerMetrics {
			cm.Metrics = append(cm.Metrics, &runtimeapi.Metric{Name: m.name, Timestamp: u.Timestamp.UnixNano(), MetricType: m.kind,
				LabelValues: labels, Value: &runtimeapi.UInt64Value{Value: m.value(u)}})
		}
		pm.ContainerMetrics = append(pm.ContainerMetrics, cm)
	}
	return pm, nil
}
