package cri

import (
	"context"
	"encoding/json"
	"time"

	"github.com/berth-runtime/berth/sandbox/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RunPodSandbox creates and starts a pod sandbox.
func (r *RuntimeService) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	if err := checkHandler("runtime_handler", req.GetRuntimeHandler()); err != nil {
		return nil, err
	}
	if req.GetConfig() == nil {
		return nil, status.Error(codes.InvalidArgument, "config is required")
	}
	pod, err := r.pods.RunPod(ctx, req.Config)
	if err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: pod.ID}, nil
}

// StopPodSandbox is idempotent: an unknown or stopped pod is OK.
func (r *RuntimeService) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	if err := r.pods.StopPod(ctx, req.GetPodSandboxId()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

// RemovePodSandbox is idempotent: an unknown pod is OK.
func (r *RuntimeService) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	if err := r.pods.RemovePod(ctx, req.GetPodSandboxId()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// UpdatePodSandboxResources records the pod-level resources the kubelet has
// just applied to the pod's cgroup (in-place resize).
func (r *RuntimeService) UpdatePodSandboxResources(ctx context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	if err := r.pods.UpdatePodResources(ctx, req.GetPodSandboxId(), req.GetOverhead(), req.GetResources()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.UpdatePodSandboxResourcesResponse{}, nil
}

// PodSandboxStatus answers with the pod's containers' statuses too, and the
// time they were taken, as the kubelet's evented PLEG reads them instead of
// asking each container. The time is taken first: nothing in the answer is
// older than it.
func (r *RuntimeService) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	now := time.Now()
	pod, err := r.pods.GetPod(req.GetPodSandboxId())
	if err != nil {
		return nil, grpcError(err)
	}
	ctrs, err := r.podContainerStatuses(ctx, pod.ID)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: podSandboxStatus(pod), ContainersStatuses: ctrs, Timestamp: now.UnixNano()}
	if req.GetVerbose() {
		info, err := json.Marshal(map[string]any{"pod": pod, "timeline": pod.Timeline})
		if err != nil {
			return nil, status.Errorf(codes.Internal, "pod %s: %v", pod.ID, err)
		}
		resp.Info = map[string]string{"info": string(info)}
	}
	return resp, nil
}

// podContainerStatuses are the statuses of the pod's containers, as
// ContainerStatus gives them, from the view: the kubelet asks for them
// constantly, so nothing here reads a container's files.
func (r *RuntimeService) podContainerStatuses(ctx context.Context, podID string) ([]*runtimeapi.ContainerStatus, error) {
	listed, err := r.pods.ListContainers(ctx, store.Filter{PodID: podID})
	if err != nil {
		return nil, err
	}
	out := make([]*runtimeapi.ContainerStatus, len(listed))
	for i, c := range listed {
		out[i] = containerStatus(c)
	}
	return out, nil
}

func podSandboxStatus(pod *store.Pod) *runtimeapi.PodSandboxStatus {
	cfg := pod.Config
	return &runtimeapi.PodSandboxStatus{
		Id:          pod.ID,
		Metadata:    cfg.Metadata,
		State:       pod.State,
		CreatedAt:   pod.CreatedAt.UnixNano(),
		Network:     podNetworkStatus(pod),
		Linux:       &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()}},
		Labels:      cfg.Labels,
		Annotations: cfg.Annotations,
	}
}

// ListPodSandbox: the node-wide list is kept, encoded, until
// sandbox.Version changes (see kept).
func (r *RuntimeService) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f := podFilter(req.GetFilter())
	resp, err := r.allPods.answer(f, r.pods.Version(), func() (*runtimeapi.ListPodSandboxResponse, bool, error) {
		items, err := r.listPods(f)
		return &runtimeapi.ListPodSandboxResponse{Items: items}, true, err
	})
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// listPods is the entries of the pods f selects.
func (r *RuntimeService) listPods(f store.Filter) ([]*runtimeapi.PodSandbox, error) {
	pods, err := r.pods.ListPods(f)
	if err != nil {
		return nil, err
	}
	// The messages are one allocation.
	msgs := make([]runtimeapi.PodSandbox, len(pods))
	items := make([]*runtimeapi.PodSandbox, len(pods))
	for i, p := range pods {
		msgs[i] = runtimeapi.PodSandbox{
			Id: p.ID, Metadata: p.Config.Metadata, State: p.State, CreatedAt: p.CreatedAt.UnixNano(),
			Labels: p.Config.Labels, Annotations: p.Config.Annotations,
		}
		items[i] = &msgs[i]
	}
	return items, nil
}
