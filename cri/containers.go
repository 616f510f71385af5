package cri

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/store"
)

func (r *RuntimeService) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	if req.GetConfig() == nil {
		return nil, status.Error(codes.InvalidArgument, "config is required")
	}
	if err := checkHandler("config.image.runtime_handler", req.Config.GetImage().GetRuntimeHandler()); err != nil {
		return nil, err
	}
	for i, m := range req.Config.GetMounts() {
		if err := checkHandler(fmt.Sprintf("config.mounts[%d].image.runtime_handler", i), m.GetImage().GetRuntimeHandler()); err != nil {
			return nil, err
		}
	}
	c, err := r.pods.CreateContainer(ctx, req.GetPodSandboxId(), req.Config)
	if err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.CreateContainerResponse{ContainerId: c.ID}, nil
}

func (r *RuntimeService) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	if err := r.pods.StartContainer(ctx, req.GetContainerId()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

// StopContainer returns within the timeout (seconds); 0 kills at once. It is
// idempotent: an unknown container is OK.
func (r *RuntimeService) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if req.GetTimeout() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "timeout %d: must not be negative", req.Timeout)
	}
	if err := r.pods.StopContainer(ctx, req.GetContainerId(), time.Duration(req.GetTimeout())*time.Second); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

// RemoveContainer is idempotent: an unknown container is OK.
func (r *RuntimeService) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	if err := r.pods.RemoveContainer(ctx, req.GetContainerId()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

// ListContainers: the node-wide list is kept, encoded, until
// sandbox.Version changes (see kept).
func (r *RuntimeService) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f := containerFilter(req.GetFilter())
	resp, err := r.allCtrs.answer(f, r.pods.Version(), func() (*runtimeapi.ListContainersResponse, bool, error) {
		ctrs, err := r.listContainers(ctx, f)
		return &runtimeapi.ListContainersResponse{Containers: ctrs}, true, err
	})
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// listContainers is the entries of the containers f selects.
func (r *RuntimeService) listContainers(ctx context.Context, f store.Filter) ([]*runtimeapi.Container, error) {
	all, err := r.pods.ListContainers(ctx, f)
	if err != nil {
		return nil, err
	}
	ctrs := make([]*runtimeapi.Container, len(all))
	for i, c := range all {
		if ctrs[i], err = listedContainer(c); err != nil {
			return nil, err
		}
	}
	return ctrs, nil
}

func (r *RuntimeService) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	c, err := r.pods.ContainerStatus(ctx, req.GetContainerId())
	if err != nil {
		return nil, grpcError(err)
	}
	st := containerStatus(c)
	resp := &runtimeapi.ContainerStatusResponse{Status: st}
	if req.GetVerbose() {
		info, err := json.Marshal(map[string]any{"pid": c.Pid, "spec": c.Spec, "timeline": c.Timeline})
		if err != nil {
			return nil, status.Errorf(codes.Internal, "container %s: %v", c.ID, err)
		}
		resp.Info = map[string]string{"info": string(info)}
	}
	return resp, nil
}

// containerStatus is c's CRI status.
func containerStatus(c *store.ContainerStatus) *runtimeapi.ContainerStatus {
	image := &runtimeapi.ImageSpec{}
	ref := containerImage(c.Container, image)
	st := &runtimeapi.ContainerStatus{
		Id: c.ID, Metadata: c.Config.Metadata, State: c.State, CreatedAt: c.CreatedAt.UnixNano(),
		StartedAt: unixNano(c.StartedAt), FinishedAt: unixNano(c.FinishedAt), ExitCode: c.ExitCode,
		Image: image, ImageRef: ref, ImageId: c.ImageID, Reason: c.Reason, Message: c.Message,
		Labels: c.Config.Labels, Annotations: c.Config.Annotations, Mounts: c.Config.Mounts, LogPath: c.LogPath,
	}
	if c.User != nil {
		st.User = containerUser(*c.User)
	}
	_, st.StopSignal = c.SignalInForce()
	if r := c.AppliedResources(); r != nil {
		st.Resources = &runtimeapi.ContainerResources{Linux: r}
	}
	return st
}

// containerUser is the identity the container's process has: uid, gid and
// its supplementary groups, sorted (as the kernel keeps them).
func containerUser(u specs.User) *runtimeapi.ContainerUser {
	groups := make([]int64, len(u.AdditionalGids))
	for i, g := range u.AdditionalGids {
		groups[i] = int64(g)
	}
	slices.Sort(groups)
	return &runtimeapi.ContainerUser{Linux: &runtimeapi.LinuxContainerUser{Uid: int64(u.UID), Gid: int64(u.GID), SupplementalGroups: groups}}
}

// unixNano is 0 for an unset time, as the CRI expects, not year 1.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func (r *RuntimeService) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if len(req.GetCmd()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "cmd is required")
	}
	if req.GetTimeout() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "timeout %d: must not be negative", req.Timeout)
	}
	res, err := r.pods.ExecSync(ctx, req.GetContainerId(), req.Cmd, time.Duration(req.GetTimeout())*time.Second)
	if err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.ExecSyncResponse{Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: int32(res.ExitCode)}, nil
}

func (r *RuntimeService) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	if err := r.pods.ReopenLog(ctx, req.GetContainerId()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

// UpdateContainerResources applies new Linux limits; a request without
// them changes nothing, as with other runtimes.
func (r *RuntimeService) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	if req.GetLinux() == nil {
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}
	if err := r.pods.UpdateResources(ctx, req.GetContainerId(), req.Linux); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

// CheckpointContainer has CRIU checkpoint a running container into a tar
// archive at the request's location, and leaves it running.
func (r *RuntimeService) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	if req.GetContainerId() == "" {
		return nil, status.Error(codes.InvalidArgument, "container_id: empty")
	}
	if req.GetTimeout() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "timeout: %d seconds is negative", req.GetTimeout())
	}
	err := r.pods.CheckpointContainer(ctx, req.GetContainerId(), req.GetLocation(), time.Duration(req.GetTimeout())*time.Second)
	if err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.CheckpointContainerResponse{}, nil
}

// containerImage is a container's image as the kubelet shows it (kubectl get
// pod: image, imageID): spec gets the name the user wrote, and the ref is
// the repo digest, or the image ID for an image that came without one.
// Records written before berth kept the name show the image as the kubelet
// asked for it.
// listedContainer is c's entry in the lists, already encoded (see
// encoded). It is made once per status of the container and kept with the
// status, which the view replaces when the container changes: the kubelet
// lists every container each second, and their encoding was most of such
// a call's time.
func listedContainer(c *store.ContainerStatus) (*runtimeapi.Container, error) {
	if msg, _ := c.Memo.Load().(*runtimeapi.Container); msg != nil {
		return msg, nil
	}
	var image runtimeapi.ImageSpec
	msg, err := encoded(&runtimeapi.Container{
		Id: c.ID, PodSandboxId: c.PodID, Metadata: c.Config.Metadata,
		Image: &image, ImageRef: containerImage(c.Container, &image), ImageId: c.ImageID, State: c.State,
		CreatedAt: c.CreatedAt.UnixNano(), Labels: c.Config.Labels, Annotations: c.Config.Annotations,
	})
	if err != nil {
		return nil, err
	}
	c.Memo.Store(msg)
	return msg, nil
}

func containerImage(c *store.Container, spec *runtimeapi.ImageSpec) (ref string) {
	*spec = runtimeapi.ImageSpec{
		Image:              cmp.Or(c.ImageName, c.Config.GetImage().GetImage()),
		Annotations:        c.Config.GetImage().GetAnnotations(),
		UserSpecifiedImage: c.Config.GetImage().GetUserSpecifiedImage(),
		RuntimeHandler:     c.Config.GetImage().GetRuntimeHandler(),
	}
	return cmp.Or(c.RepoDigest, c.ImageID)
}
