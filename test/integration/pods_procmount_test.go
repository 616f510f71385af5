package integration

import (
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/test/harness"
)

// TestProcMountUnmasked checks that masked_paths and readonly_paths are
// used as sent (procMount, KEP-4265): the kubelet's default lists
// (procMount Default) cover /proc/kcore, /proc/timer_list, /sys/firmware
// and make /proc/sys read-only; empty lists (procMount Unmasked) leave every
// one of them uncovered. In a plain pod, and in a pod with its own user
// namespace (hostUsers: false, where Unmasked is meant to be used) when the
// kernel has what those need.
func TestProcMountUnmasked(t *testing.T) {
	t.Parallel()
	e := startPodEnvWith(t, v1.Config{}, harness.Options{State: stateOnTmpfs(t)})
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("pod", func(t *testing.T) {
		cfg := e.podConfig("procmount")
		checkProcMasks(t, e, cfg, true)
	})
	t.Run("userns-pod", func(t *testing.T) {
		if h := st.GetRuntimeHandlers(); len(h) != 1 || !h[0].GetFeatures().GetUserNamespaces() {
			t.Skipf("Linux %s: user namespaces not advertised (TestUserNamespacePod checks why)", kernelRelease(t))
		}
		cfg := e.podConfig("procmount-userns")
		m := rootMapping(usernsHost, 65536)
		usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
		checkProcMasks(t, e, cfg, false)
	})
	e.assertNoLeaks(t)
}

// checkProcMasks runs a container with the kubelet's default lists and one
// with empty lists in a pod of cfg, and looks at what covers each path
// (those this kernel has). hostRoot: the containers' root is the host's, who
// may read /proc/timer_list (mode 0400).
func checkProcMasks(t *testing.T, e *podEnv, cfg *runtimeapi.PodSandboxConfig, hostRoot bool) {
	pod := e.runPod(t, cfg)
	defer e.removePod(t, pod)
	run := func(name string, masked, readonly []string) string {
		cc := e.ctrConfig(name, sleeper...)
		cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			MaskedPaths: masked, ReadonlyPaths: readonly}}
		return e.runContainer(t, pod, cfg, cc)
	}
	defaults := run("default", spec.DefaultMaskedPaths, spec.DefaultReadonlyPaths)
	unmasked := run("unmasked", []string{}, []string{})

	// covered maps each mount point in the container to its mount options.
	covered := func(ctr string) map[string]string {
		m := map[string]string{}
		for _, line := range strings.Split(e.sh(t, ctr, "cat /proc/self/mountinfo"), "\n") {
			if f := strings.Fields(line); len(f) > 5 {
				m[f[4]] = f[5]
			}
		}
		return m
	}
	checked := []string{"/proc/kcore", "/proc/timer_list", "/proc/keys", "/sys/firmware", "/proc/sys", "/proc/sysrq-trigger"}
	inDefault, inUnmasked := covered(defaults), covered(unmasked)
	for _, p := range checked {
		if _, err := os.Stat(p); err != nil {
			continue // not in this kernel (as /proc/kcore without CONFIG_PROC_KCORE): nothing to mask
		}
		if _, ok := inDefault[p]; !ok {
			t.Errorf("default lists: nothing mounted over %s", p)
		}
		if opts, ok := inUnmasked[p]; ok {
			t.Errorf("empty lists: %s is covered by a mount (%s)", p, opts)
		}
	}
	if opts := inDefault["/proc/sys"]; !strings.HasPrefix(opts, "ro") {
		t.Errorf("default lists: /proc/sys mounted %q, want read-only", opts)
	}
	if !hostRoot {
		return
	}
	// What the masks are for: /proc/timer_list shows the host's timers
	// only where it is not masked.
	timers := "/bin/busybox head -c 100 /proc/timer_list"
	if got := e.sh(t, unmasked, timers); !strings.Contains(got, "Timer List") {
		t.Errorf("empty lists: /proc/timer_list reads %q", got)
	}
	if got := e.sh(t, defaults, timers); got != "" {
		t.Errorf("default lists: /proc/timer_list reads %q, want nothing (masked)", got)
	}
}
