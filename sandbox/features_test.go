package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestCheckFeaturesRefusesRecursiveReadOnlyWithoutMountSetattr(t *testing.T) {
	cfg := &runtimeapi.ContainerConfig{Mounts: []*runtimeapi.Mount{
		{HostPath: "/srv", ContainerPath: "/plain", Readonly: true},
		{HostPath: "/srv", ContainerPath: "/data", Readonly: true, RecursiveReadOnly: true},
	}}
	old := &Manager{}
	err := old.checkFeatures(cfg)
	if !errors.Is(err, errkind.Invalid) || !strings.Contains(err.Error(), "mount /data: recursive_read_only") {
		t.Fatalf("without mount_setattr: %v, want an invalid argument naming the mount and the field", err)
	}
	recent := &Manager{features: KernelFeatures{RecursiveReadOnlyMounts: true}}
	if err := recent.checkFeatures(cfg); err != nil {
		t.Fatalf("with mount_setattr: %v", err)
	}
}
