package integration

import (
	"os"
	"regexp"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// TestPrivilegedNeedsPrivilegedPod: a privileged container is refused
// (InvalidArgument naming the field and why) in a pod that did not say it
// would run one (the CRI's sandbox privileged field: "If a privileged
// container is to be executed within it, this MUST be true") and in a pod
// with its own user namespace, leaving nothing behind; in a privileged pod
// it runs, with every capability the host has.
func TestPrivilegedNeedsPrivilegedPod(t *testing.T) {
	t.Parallel()
	// The user-namespace pod needs idmapped mounts on the state folder (see
	// TestUserNamespacePod).
	e := startPodEnvWith(t, v1.Config{}, harness.Options{State: stateOnTmpfs(t)})
	privileged := func(name string) *runtimeapi.ContainerConfig {
		cc := e.ctrConfig(name, sleeper...)
		cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}}
		return cc
	}
	refused := func(t *testing.T, cfg *runtimeapi.PodSandboxConfig, why string) {
		t.Helper()
		pod := e.runPod(t, cfg)
		cc := privileged("refused")
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		assertCode(t, err, one(codes.InvalidArgument), "config.linux.security_context.privileged", why)
		if ids := e.listContainerIDs(t, &runtimeapi.ContainerFilter{PodSandboxId: pod}); len(ids) != 0 {
			t.Errorf("the refused container is listed: %v", ids)
		}
		e.removePod(t, pod)
		e.assertNoLeaks(t)
	}

	t.Run("unprivileged-pod", func(t *testing.T) {
		refused(t, e.podConfig("priv-in-plain"), "the pod is not privileged")
	})

	t.Run("user-namespace-pod", func(t *testing.T) {
		if !e.userNamespaces(t) {
			t.Skipf("Linux %s: user namespaces not advertised", kernelRelease(t))
		}
		cfg := e.podConfig("priv-in-userns")
		m := rootMapping(usernsHost, 65536)
		usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_CONTAINER)
		cfg.Linux.SecurityContext.Privileged = true // asked for, still refused
		refused(t, cfg, "the pod has its own user namespace")
	})

	t.Run("privileged-pod", func(t *testing.T) {
		cfg := e.podConfig("priv-in-priv")
		cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{Privileged: true}
		pod := e.runPod(t, cfg)
		ctr := e.runContainer(t, pod, cfg, privileged("privileged"))
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		want := regexp.MustCompile(`(?m)^CapEff:.*$`).FindString(string(b)) // the test runs as root with every capability
		if got := e.sh(t, ctr, "grep ^CapEff: /proc/self/status"); got != want {
			t.Errorf("the privileged container's capabilities: %q, want the host root's %q", got, want)
		}
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
		e.assertNoLeaks(t)
	})
}
