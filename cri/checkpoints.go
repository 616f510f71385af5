package cri

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CheckpointPod has CRIU checkpoint the listed running containers of a pod
// together (all frozen, dumped, thawed) into the request's empty folder,
// and leaves them running. The kubelet sets the call's deadline.
func (r *RuntimeService) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, status.Error(codes.InvalidArgument, "pod_sandbox_id: empty")
	}
	if err := r.pods.CheckpointPod(ctx, req.PodSandboxId, req.GetOutputPath(), req.GetContainerIds(), req.GetOptions()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.CheckpointPodResponse{}, nil
}

// RestorePod makes a pod of the request's config and, from the pod
// checkpoint, its containers, created: StartContainer restores each.
func (r *RuntimeService) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	if err := checkHandler("runtime_handler", req.GetRuntimeHandler()); err != nil {
		return nil, err
	}
	if req.GetConfig() == nil {
		return nil, status.Error(codes.InvalidArgument, "config is required")
	}
	for i, c := range req.GetContainerConfigs() {
		if c == nil {
			return nil, status.Errorf(codes.InvalidArgument, "container_configs[%d]: empty", i)
		}
		if err := checkHandler("container_configs[].image.runtime_handler", c.GetImage().GetRuntimeHandler()); err != nil {
			return nil, err
		}
	}
	pod, restored, err := r.pods.RestorePod(ctx, req.GetCheckpointPath(), req.Config, req.GetOptions(), req.GetContainerConfigs())
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &runtimeapi.RestorePodResponse{PodSandboxId: pod.ID}
	for _, c := range restored {
		resp.RestoredContainers = append(resp.RestoredContainers, &runtimeapi.RestoredContainer{Name: c.Name, ContainerId: c.ID})
	}
	return resp, nil
}
