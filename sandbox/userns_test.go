package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestCheckUserns(t *testing.T) {
	one := func(c, h, l uint32) []*runtimeapi.IDMapping {
		return []*runtimeapi.IDMapping{{ContainerId: c, HostId: h, Length: l}}
	}
	good := one(0, 100000, 65536)
	for _, c := range []struct {
		name string
		opts *runtimeapi.UserNamespace
		kind error // nil: accepted
		want string
	}{
		{"unset", nil, nil, ""},
		{"node", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE}, nil, ""},
		{"node-with-map", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE, Uids: good}, errkind.Invalid, "mode NODE takes no uids"},
		{"container", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_CONTAINER}, errkind.Invalid, "mode CONTAINER"},
		{"target", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_TARGET}, errkind.Invalid, "mode TARGET"},
		{"two-gids", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good, Gids: append(one(0, 1, 1), one(1, 5, 1)...)},
			errkind.Invalid, "gids: want exactly one"},
		{"root-unmapped", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: one(1, 100000, 10), Gids: good},
			errkind.Invalid, "uids: container ID 0 is not mapped"},
		{"empty", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good, Gids: one(0, 100000, 0)},
			errkind.Invalid, "gids: mapping length is 0"},
		{"wraps", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: one(0, 1<<32-10, 20), Gids: good},
			errkind.Invalid, "uids: host range"},
		{"pod-old-kernel", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good, Gids: good}, errkind.FailedPrecondition, "mode POD"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: c.opts}}}}
			_, err := podUserNS(cfg, KernelFeatures{})
			if c.kind == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), usernsField) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %v naming %s and %q", err, c.kind, usernsField, c.want)
			}
		})
	}
	cfg := &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good, Gids: good}}}}}
	if u, err := podUserNS(cfg, KernelFeatures{UserNamespaces: true}); err != nil || u == nil {
		t.Errorf("mode POD on a kernel that can: %v, %v", u, err)
	}
	cfg.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_NODE
	if _, err := podUserNS(cfg, KernelFeatures{UserNamespaces: true}); !errors.Is(err, errkind.FailedPrecondition) ||
		!strings.Contains(err.Error(), usernsField+".mode POD with network NODE") {
		t.Errorf("mode POD on the host's network: %v, want FailedPrecondition naming the field", err)
	}
}

func TestCheckContainerUserns(t *testing.T) {
	m := []*runtimeapi.IDMapping{{ContainerId: 0, HostId: 100000, Length: 65536}}
	podNS := &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}
	pod := func(u *runtimeapi.UserNamespace) *store.Pod {
		return &store.Pod{Config: &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: u}}}}}
	}
	ctr := func(u *runtimeapi.UserNamespace) *runtimeapi.ContainerConfig {
		return &runtimeapi.ContainerConfig{Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: u}}}}
	}
	node := &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE}
	for name, c := range map[string]struct {
		pod, ctr *runtimeapi.UserNamespace
		ok       bool
	}{
		"same": {podNS, podNS, true}, "unset": {podNS, nil, true}, "node-both": {nil, node, true},
		"node-in-userns-pod": {podNS, node, false}, "userns-in-host-pod": {nil, podNS, false},
	} {
		err := checkContainerUserns(pod(c.pod), ctr(c.ctr))
		if (err == nil) != c.ok || (err != nil && (!errors.Is(err, errkind.Invalid) || !strings.Contains(err.Error(), "userns_options"))) {
			t.Errorf("%s: %v, want ok %v", name, err, c.ok)
		}
	}
}
