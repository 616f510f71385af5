package cri

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestUnknownRuntimeHandlerRefused checks that every request carrying an
// ImageSpec refuses a runtime handler berth does not have, naming the field,
// before it reaches the image store or the pods (nil here: reaching them
// would panic), and that the default handler passes.
func TestUnknownRuntimeHandlerRefused(t *testing.T) {
	ctx := context.Background()
	images := NewImageService(nil, nil)
	rt := NewRuntimeService(Config{}, nil, nil)
	spec := &runtimeapi.ImageSpec{Image: "busybox", RuntimeHandler: "gvisor"}
	for _, c := range []struct {
		field string
		call  func() error
	}{
		{"image.runtime_handler", func() error {
			_, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: spec})
			return err
		}},
		{"image.runtime_handler", func() error {
			_, err := images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec})
			return err
		}},
		{"image.runtime_handler", func() error {
			_, err := images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: spec})
			return err
		}},
		{"filter.image.runtime_handler", func() error {
			_, err := images.ListImages(ctx, &runtimeapi.ListImagesRequest{Filter: &runtimeapi.ImageFilter{Image: spec}})
			return err
		}},
		{"config.image.runtime_handler", func() error {
			_, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{Config: &runtimeapi.ContainerConfig{Image: spec}})
			return err
		}},
		{"config.mounts[1].image.runtime_handler", func() error {
			mounts := []*runtimeapi.Mount{{ContainerPath: "/a", HostPath: "/tmp"}, {ContainerPath: "/m", Image: spec}}
			_, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{Config: &runtimeapi.ContainerConfig{Mounts: mounts}})
			return err
		}},
		{"runtime_handler", func() error {
			_, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{}, RuntimeHandler: "gvisor"})
			return err
		}},
	} {
		err := c.call()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.field+` "gvisor"`) {
			t.Errorf("%s: got %v, want InvalidArgument naming it", c.field, err)
		}
	}
	for _, h := range []string{"", runtimeName} {
		if err := checkHandler("image.runtime_handler", h); err != nil {
			t.Errorf("handler %q refused: %v", h, err)
		}
	}
}
