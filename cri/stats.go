package cri

import (
	"context"
	"errors"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox"
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
// running ones).
func (r *RuntimeService) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	all, err := r.pods.ListContainers(ctx, containerStatsFilter(req.GetFilter()))
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &runtimeapi.ListContainerStatsResponse{}
	for _, c := range all {
		if st, ok := r.listedContainerStats(c.Container); ok {
			resp.Stats = append(resp.Stats, st)
		}
	}
	return resp, nil
}

// listedContainerStats is one container's entry in a node- or pod-wide list:
// a container whose usage cannot be read is logged and listed without usage,
// so that it does not cost the kubelet every other container's figures.
func (r *RuntimeService) listedContainerStats(c *sandbox.Container) (*runtimeapi.ContainerStats, bool) {
	st, ok, err := r.containerStats(c)
	if err != nil {
		r.cfg.Logger.Warn("container stats unreadable; listed without usage", "container", c.ID, "err", err)
		return &runtimeapi.ContainerStats{Attributes: containerAttributes(c)}, true
	}
	return st, ok
}

func containerAttributes(c *sandbox.Container) *runtimeapi.ContainerAttributes {
	return &runtimeapi.ContainerAttributes{Id: c.ID, Metadata: c.Config.Metadata, Labels: c.Config.Labels, Annotations: c.Config.Annotations}
}

func (r *RuntimeService) containerStats(c *sandbox.Container) (*runtimeapi.ContainerStats, bool, error) {
	u, ok, err := r.pods.ContainerUsage(c)
	if !ok || err != nil {
		return nil, ok, err
	}
	ts := u.Timestamp.UnixNano()
	return &runtimeapi.ContainerStats{
		Attributes: containerAttributes(c),
		Cpu:        cpuUsage(u),
		Memory:     memoryUsage(u),
		WritableLayer: &runtimeapi.FilesystemUsage{Timestamp: ts, FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: r.cfg.Root},
			UsedBytes: &runtimeapi.UInt64Value{Value: u.LayerBytes}, InodesUsed: &runtimeapi.UInt64Value{Value: u.LayerInodes}},
	}, true, nil
}

func cpuUsage(u sandbox.Usage) *runtimeapi.CpuUsage {
	return &runtimeapi.CpuUsage{Timestamp: u.Timestamp.UnixNano(),
		UsageCoreNanoSeconds: &runtimeapi.UInt64Value{Value: u.CPUUsageNanos},
		UsageNanoCores:       &runtimeapi.UInt64Value{Value: u.CPUNanoCores}}
}

func memoryUsage(u sandbox.Usage) *runtimeapi.MemoryUsage {
	return &runtimeapi.MemoryUsage{Timestamp: u.Timestamp.UnixNano(),
		WorkingSetBytes: &runtimeapi.UInt64Value{Value: u.MemoryWorkingSetBytes},
		UsageBytes:      &runtimeapi.UInt64Value{Value: u.MemoryUsageBytes},
		RssBytes:        &runtimeapi.UInt64Value{Value: u.MemoryRSSBytes},
		PageFaults:      &runtimeapi.UInt64Value{Value: u.PageFaults},
		MajorPageFaults: &runtimeapi.UInt64Value{Value: u.MajorPageFaults}}
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
			st = &runtimeapi.PodSandboxStats{Attributes: podAttributes(p)}
		}
		resp.Stats = append(resp.Stats, st)
	}
	return resp, nil
}

func (r *RuntimeService) podStats(ctx context.Context, pod *sandbox.Pod) (*runtimeapi.PodSandboxStats, error) {
	st := &runtimeapi.PodSandboxStats{
		Attributes: podAttributes(pod),
		Linux:      &runtimeapi.LinuxPodSandboxStats{},
	}
	u, ok, err := r.pods.PodUsage(pod)
	if err != nil {
		return nil, err
	}
	if ok {
		st.Linux.Cpu, st.Linux.Memory = cpuUsage(u), memoryUsage(u)
		st.Linux.Process = &runtimeapi.ProcessUsage{Timestamp: u.Timestamp.UnixNano(), ProcessCount: &runtimeapi.UInt64Value{Value: u.Pids}}
	}
	if st.Linux.Network, err = r.podNetworkStats(pod); err != nil {
		return nil, err
	}
	ctrs, err := r.pods.ListContainers(ctx, sandbox.Filter{PodID: pod.ID})
	if err != nil {
		return nil, err
	}
	for _, c := range ctrs {
		if cs, ok := r.listedContainerStats(c.Container); ok {
			st.Linux.Containers = append(st.Linux.Containers, cs)
		}
	}
	return st, nil
}

func podAttributes(pod *sandbox.Pod) *runtimeapi.PodSandboxAttributes {
	return &runtimeapi.PodSandboxAttributes{Id: pod.ID, Metadata: pod.Config.Metadata, Labels: pod.Config.Labels, Annotations: pod.Config.Annotations}
}

// podNetworkStats is the pod's interfaces for the kubelet's summary: its own
// interface (eth0) as the default, any others after it; nil for a pod with
// no network namespace of its own.
func (r *RuntimeService) podNetworkStats(pod *sandbox.Pod) (*runtimeapi.NetworkUsage, error) {
	ifaces, ok, err := r.pods.PodNetworkUsage(pod)
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
