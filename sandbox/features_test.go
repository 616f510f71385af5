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

func TestSELinuxFieldsRefusedOnlyWhereSELinuxIsOn(t *testing.T) {
	label := &runtimeapi.SELinuxOption{Type: "container_t", Level: "s0:c1,c2"}
	containers := map[string]*runtimeapi.ContainerConfig{
		"linux.security_context.selinux_options": {Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{SelinuxOptions: label}}},
		"mount /data: selinux_relabel": {Mounts: []*runtimeapi.Mount{
			{HostPath: "/srv", ContainerPath: "/plain"},
			{HostPath: "/srv", ContainerPath: "/data", SelinuxRelabel: true}}},
	}
	pod := &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{
		SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{SelinuxOptions: label}}}
	on := &Manager{features: KernelFeatures{SELinux: true}}
	off := &Manager{}
	for field, cfg := range containers {
		err := on.checkFeatures(cfg)
		if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), field) {
			t.Errorf("SELinux on, %s: %v, want a failed precondition naming the field", field, err)
		}
		if err := off.checkFeatures(cfg); err != nil {
			t.Errorf("SELinux off, %s: %v", field, err)
		}
	}
	err := on.checkPodFeatures(pod)
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "linux.security_context.selinux_options") {
		t.Errorf("SELinux on, pod: %v, want a failed precondition naming the field", err)
	}
	if err := off.checkPodFeatures(pod); err != nil {
		t.Errorf("SELinux off, pod: %v", err)
	}
	empty := &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{
		SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{SelinuxOptions: &runtimeapi.SELinuxOption{}}}}
	if err := on.checkPodFeatures(empty); err != nil {
		t.Errorf("SELinux on, empty options: %v", err)
	}
}
