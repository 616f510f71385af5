package sandbox

import (
	"context"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/sandbox/shim"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// What the manager needs of the packages below it, as narrow interfaces:
// berthd passes the real ones (image.Service, cgroups.Manager), unit tests
// fakes, which run without root.

// Images resolves and leases the images containers are made from.
type Images interface {
	Get(ref string) (*image.Image, error)
	Lease(owner string, img *image.Image) ([]string, error)
	Release(owner string) error
	LeaseOwners() ([]string, error)
}

// Cgroups makes, reads and removes the cgroups of pods and containers.
type Cgroups interface {
	Mode() cgroups.Mode
	PodCgroup(cgroupParent, podUID string) string
	CreatePod(podCgroup string, res *runtimeapi.LinuxContainerResources) error
	RemovePod(podCgroup string) error
	ContainerCgroupsPath(podCgroup, containerID string) string
	Kill(cgroupsPath string) error
	Freeze(cgroupsPath string, frozen bool) error
	Stats(cgroupsPath string) (cgroups.Stats, error)
	Details(cgroupsPath string) (cgroups.Details, error)
}

// ShimStarter starts the shim of a pod folder (or reaches the one that
// serves it) and returns a client of it.
type ShimStarter func(ctx context.Context, podDir string) (*shim.Client, error)
