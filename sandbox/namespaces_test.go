package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerNamespaces: the pod's modes repeated pass, a container's own
// PID mode is honoured where the pod allows it, TARGET joins the running
// target's PID namespace, and the rest is refused naming the field.
func TestContainerNamespaces(t *testing.T) {
	const pod, ctr, node, target = runtimeapi.NamespaceMode_POD, runtimeapi.NamespaceMode_CONTAINER,
		runtimeapi.NamespaceMode_NODE, runtimeapi.NamespaceMode_TARGET
	m := testManager(t)
	opts := func(net, ipc, pid runtimeapi.NamespaceMode) *runtimeapi.NamespaceOption {
		return &runtimeapi.NamespaceOption{Network: net, Ipc: ipc, Pid: pid}
	}
	podOf := func(id string, o *runtimeapi.NamespaceOption, pausePID int) *Pod {
		return &Pod{ID: id, PausePID: pausePID, Config: &runtimeapi.PodSandboxConfig{
			Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: o}}}}
	}
	own, shared, host := podOf("p1", opts(pod, pod, ctr), 0), podOf("p2", opts(pod, pod, pod), 42), podOf("p3", opts(node, node, node), 0)
	m.addTestContainer(t, "running", "p1")
	m.state.setState(shim.State{ID: "running", Status: shim.StatusRunning, Pid: 1234})
	m.addTestContainer(t, "created", "p1")
	m.state.setState(shim.State{ID: "created", Status: shim.StatusCreated})
	m.addTestContainer(t, "elsewhere", "p2")
	m.state.setState(shim.State{ID: "elsewhere", Status: shim.StatusRunning, Pid: 99})
	withTarget := func(id string) *runtimeapi.NamespaceOption {
		o := opts(pod, pod, target)
		o.TargetId = id
		return o
	}
	for _, c := range []struct {
		name    string
		pod     *Pod
		ctr     *runtimeapi.NamespaceOption
		want    pidNS
		kind    *errkind.Kind
		mention string
	}{
		{name: "no options, own", pod: own},
		{name: "no options, shared", pod: shared, want: pidNS{path: "/proc/42/ns/pid"}},
		{name: "no options, host", pod: host, want: pidNS{host: true}},
		{name: "pod's modes, own", pod: own, ctr: opts(pod, pod, ctr)},
		{name: "pod's modes, shared", pod: shared, ctr: opts(pod, pod, pod), want: pidNS{path: "/proc/42/ns/pid"}},
		{name: "pod's modes, host", pod: host, ctr: opts(node, node, node), want: pidNS{host: true}},
		{name: "own in shared pod", pod: shared, ctr: opts(pod, pod, ctr)},
		{name: "target", pod: own, ctr: withTarget("running"), want: pidNS{path: "/proc/1234/ns/pid"}},
		{name: "target prefix", pod: own, ctr: withTarget("runn"), want: pidNS{path: "/proc/1234/ns/pid"}},
		{name: "pod pid without one", pod: own, ctr: opts(pod, pod, pod), kind: errkind.Invalid, mention: ".pid"},
		{name: "host pid in private pod", pod: own, ctr: opts(pod, pod, node), kind: errkind.Invalid, mention: ".pid"},
		{name: "private pid in host pod", pod: host, ctr: opts(node, node, ctr), kind: errkind.Invalid, mention: ".pid"},
		{name: "network differs", pod: own, ctr: opts(node, pod, ctr), kind: errkind.Invalid, mention: ".network"},
		{name: "ipc differs", pod: own, ctr: opts(pod, node, ctr), kind: errkind.Invalid, mention: ".ipc"},
		{name: "target missing", pod: own, ctr: withTarget(""), kind: errkind.Invalid, mention: "target_id"},
		{name: "target unknown", pod: own, ctr: withTarget("nope"), kind: errkind.NotFound, mention: "target_id"},
		{name: "target not running", pod: own, ctr: withTarget("created"), kind: errkind.FailedPrecondition, mention: "target_id"},
		{name: "target in another pod", pod: own, ctr: withTarget("elsewhere"), kind: errkind.Invalid, mention: "target_id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &runtimeapi.ContainerConfig{}
			if c.ctr != nil {
				cfg.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: c.ctr}}
			}
			got, err := m.containerNamespaces(c.pod, cfg)
			if c.kind == nil {
				if err != nil || got != c.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
				}
				return
			}
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("error %v, want %v mentioning %q", err, c.kind, c.mention)
			}
		})
	}
}
