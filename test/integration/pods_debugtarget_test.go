package integration

import (
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// withNamespaces gives a container config namespace options, as the kubelet
// does for every container (the pod's modes, or a debug container's TARGET).
func withNamespaces(cfg *runtimeapi.ContainerConfig, o *runtimeapi.NamespaceOption) *runtimeapi.ContainerConfig {
	cfg.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: o}}
	return cfg
}

// TestDebugTargetPIDNamespace checks kubectl debug --target: in a pod whose
// containers each have their own PID namespace (Kubernetes' default), a
// container of pid mode TARGET joins its target's, sees the target's
// process and no other container's, and keeps running across a berthd
// restart. Namespace options berth cannot honour are refused naming the
// field, with nothing left behind.
func TestDebugTargetPIDNamespace(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	const pod, ctrNS = runtimeapi.NamespaceMode_POD, runtimeapi.NamespaceMode_CONTAINER
	podOpts := &runtimeapi.NamespaceOption{Network: pod, Ipc: pod, Pid: ctrNS}
	cfg := podWithNamespaces(e, "debug-target", podOpts)
	id := e.runPod(t, cfg)
	app := e.runContainer(t, id, cfg, withNamespaces(e.ctrConfig("app", "/bin/sleep", "300001"), podOpts))
	other := e.runContainer(t, id, cfg, withNamespaces(e.ctrConfig("other", "/bin/sleep", "300002"), podOpts))
	targeting := func(target string) *runtimeapi.NamespaceOption {
		return &runtimeapi.NamespaceOption{Network: pod, Ipc: pod, Pid: runtimeapi.NamespaceMode_TARGET, TargetId: target}
	}
	debug := e.runContainer(t, id, cfg, withNamespaces(e.ctrConfig("debug", "/bin/sleep", "300003"), targeting(app)))

	checkDebug := func(t *testing.T) {
		nsApp, nsDebug, nsOther := e.ctrNamespaces(t, app), e.ctrNamespaces(t, debug), e.ctrNamespaces(t, other)
		if nsDebug["pid"] != nsApp["pid"] {
			t.Errorf("debug container's PID namespace %s, its target app's %s", nsDebug["pid"], nsApp["pid"])
		}
		if nsOther["pid"] == nsApp["pid"] {
			t.Errorf("other shares app's PID namespace %s in a pod of pid mode CONTAINER", nsApp["pid"])
		}
		ps := e.sh(t, debug, "/bin/busybox ps")
		for _, want := range []string{"sleep 300001", "sleep 300003"} {
			if !strings.Contains(ps, want) {
				t.Errorf("debug container's ps lacks %q:\n%s", want, ps)
			}
		}
		if strings.Contains(ps, "sleep 300002") {
			t.Errorf("debug container sees the other container's process:\n%s", ps)
		}
	}
	checkDebug(t)

	refused := func(t *testing.T, name string, o *runtimeapi.NamespaceOption, want codes.Code, mention ...string) {
		t.Helper()
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
			PodSandboxId: id, SandboxConfig: cfg, Config: withNamespaces(e.ctrConfig(name, "/bin/sleep", "1"), o)})
		assertCode(t, err, one(want), mention...)
	}
	t.Run("unknown-target", func(t *testing.T) {
		refused(t, "unknown", targeting("no-such-container"), codes.NotFound, "target_id")
	})
	t.Run("stopped-target", func(t *testing.T) {
		stopped := e.runContainer(t, id, cfg, withNamespaces(e.ctrConfig("stopped", "/bin/sleep", "300004"), podOpts))
		e.stop(t, stopped, 0)
		refused(t, "late", targeting(stopped), codes.FailedPrecondition, "target_id", "not running")
	})
	t.Run("network-differs", func(t *testing.T) {
		refused(t, "hostnet", &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE, Ipc: pod, Pid: ctrNS},
			codes.InvalidArgument, "namespace_options.network")
	})
	t.Run("ipc-differs", func(t *testing.T) {
		refused(t, "hostipc", &runtimeapi.NamespaceOption{Network: pod, Ipc: runtimeapi.NamespaceMode_NODE, Pid: ctrNS},
			codes.InvalidArgument, "namespace_options.ipc")
	})
	t.Run("pod-pid-without-one", func(t *testing.T) {
		refused(t, "podpid", &runtimeapi.NamespaceOption{Network: pod, Ipc: pod, Pid: pod},
			codes.InvalidArgument, "namespace_options.pid")
	})

	// The debug container's record holds no PID of its target: after a
	// restart it is still running, in app's PID namespace.
	e.d.Restart()
	if st := e.status(t, debug); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("debug container is %s after a berthd restart", st.State)
	}
	checkDebug(t)

	e.removePod(t, id)
	e.assertNoLeaks(t)
}
