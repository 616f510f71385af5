package cri

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/berth-runtime/berth/image"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type imageService struct {
	runtimeapi.UnimplementedImageServiceServer
	images *image.Service
	layers WritableLayers
}

// WritableLayers reports the containers' writable layers' space, the
// container filesystem of ImageFsInfo (the sandbox manager).
type WritableLayers interface {
	ContainerFsUsage() image.FsUsage
}

// NewImageService serves the CRI ImageService from images, and layers for
// ImageFsInfo's container filesystem.
func NewImageService(images *image.Service, layers WritableLayers) runtimeapi.ImageServiceServer {
	return &imageService{images: images, layers: layers}
}

func (s *imageService) ListImages(_ context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	if err := checkHandler("filter.image.runtime_handler", req.GetFilter().GetImage().GetRuntimeHandler()); err != nil {
		return nil, err
	}
	imgs, err := s.images.List(req.GetFilter().GetImage().GetImage())
	if err != nil {
		return nil, imageError("filter.image.image", err)
	}
	resp := &runtimeapi.ListImagesResponse{Images: make([]*runtimeapi.Image, 0, len(imgs))}
	for _, img := range imgs {
		resp.Images = append(resp.Images, toCRIImage(img))
	}
	return resp, nil
}

// ImageStatus answers OK with no image for a missing one: that is the CRI
// contract the kubelet relies on to decide to pull.
func (s *imageService) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, status.Error(codes.InvalidArgument, "image.image is required")
	}
	if err := checkHandler("image.runtime_handler", req.GetImage().GetRuntimeHandler()); err != nil {
		return nil, err
	}
	img, err := s.images.Get(ref)
	if errors.Is(err, image.ErrNotFound) {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	if err != nil {
		return nil, imageError("image.image", err)
	}
	resp := &runtimeapi.ImageStatusResponse{Image: toCRIImage(img)}
	if req.GetVerbose() {
		// leases: the containers holding the image's layers.
		leases, err := s.images.LeaseOwnersOf(img)
		if err != nil {
			return nil, grpcError(err)
		}
		info, err := json.Marshal(map[string]any{"config": img.Config, "chainIDs": img.ChainIDs, "manifests": img.Manifests,
			"created": img.Created, "leases": leases})
		if err != nil {
			return nil, status.Errorf(codes.Internal, "image %s: %v", img.ID, err)
		}
		resp.Info = map[string]string{"info": string(info)}
	}
	return resp, nil
}

func (s *imageService) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, status.Error(codes.InvalidArgument, "image.image is required")
	}
	if err := checkHandler("image.runtime_handler", req.GetImage().GetRuntimeHandler()); err != nil {
		return nil, err
	}
	var auth *image.Auth
	if a := req.GetAuth(); a != nil {
		auth = &image.Auth{Username: a.Username, Password: a.Password, Auth: a.Auth,
			IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	}
	img, err := s.images.Pull(ctx, ref, auth)
	if err != nil {
		return nil, imageError("image.image", err)
	}
	return &runtimeapi.PullImageResponse{ImageRef: img.ID}, nil
}

// RemoveImage is idempotent: a missing image is OK.
func (s *imageService) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, status.Error(codes.InvalidArgument, "image.image is required")
	}
	if err := checkHandler("image.runtime_handler", req.GetImage().GetRuntimeHandler()); err != nil {
		return nil, err
	}
	if err := s.images.Remove(ref); err != nil {
		return nil, imageError("image.image", err)
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ImageFsInfo reports the image store (snapshots and content) as the image
// filesystem and the writable layers as the container filesystem, each
// with its own figures and its filesystem's mount point, also when the two
// share one filesystem: the kubelet (KubeletSeparateDiskGC) wants both
// lists and takes equal mount points for one filesystem.
func (s *imageService) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	u, err := s.images.FsInfo()
	if err != nil {
		return nil, imageError("", err)
	}
	return &runtimeapi.ImageFsInfoResponse{
		ImageFilesystems:     []*runtimeapi.FilesystemUsage{filesystemUsage(u)},
		ContainerFilesystems: []*runtimeapi.FilesystemUsage{filesystemUsage(s.layers.ContainerFsUsage())},
	}, nil
}

func filesystemUsage(u image.FsUsage) *runtimeapi.FilesystemUsage {
	return &runtimeapi.FilesystemUsage{
		Timestamp:  u.Timestamp.UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: u.Mountpoint},
		UsedBytes:  &runtimeapi.UInt64Value{Value: u.UsedBytes},
		InodesUsed: &runtimeapi.UInt64Value{Value: u.Inodes},
	}
}
