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

// TestProcMountUnmasked checks which /proc paths are masked and read-only
// (procMount, KEP-4265). The kubelet's default lists (procMount Default)
// cover /proc/kcore, /proc/timer_list, /sys/firmware and make /proc/sys
// read-only. Empty lists, which are also what a client sending none (crictl,
// a script) sends, get the same defaults in a pod in the host's user
// namespace: root there cannot open /proc/sys/kernel/core_pattern for
// writing nor read /proc/timer_list. Only in a pod with its own user
// namespace (hostUsers: false, the only place Kubernetes allows procMount
// Unmasked), when the kernel has what those need, do empty lists leave every
// one of them uncovered.
func TestProcMountUnmasked(t *testing.T) {
	t.Parallel()
	e := startPodEnvWith(t, v1.Config{}, harness.Options{State: stateOnTmpfs(t)})
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("pod", func(t *testing.T) {
		cfg := e.podConfig("procmount")
		checkProcMasks(t, e, cfg, false)
	})
	t.Run("userns-pod", func(t *testing.T) {
		if h := st.GetRuntimeHandlers(); len(h) != 1 || !h[0].GetFeatures().GetUserNamespaces() {
			t.Skipf("Linux %s: user namespaces not advertised (TestUserNamespacePod checks why)", kernelRelease(t))
		}
		cfg := e.podConfig("procmount-userns")
		m := rootMapping(usernsHost, 65536)
		usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
		checkProcMasks(t, e, cfg, true)
	})
	e.assertNoLeaks(t)
}

// checkProcMasks runs a container with the kubelet's default lists and one
// with empty lists in a pod of cfg, and looks at what covers each path
// (those this kernel has). ownUserNS: the pod has its own user namespace,
// where empty lists mask nothing; in the host's they are the defaults, and
// the containers' root is the host's, who could otherwise write
// core_pattern and read /proc/timer_list (mode 0400).
func checkProcMasks(t *testing.T, e *podEnv, cfg *runtimeapi.PodSandboxConfig, ownUserNS bool) {
	pod := e.runPod(t, cfg)
	defer e.removePod(t, pod)
	run := func(name string, masked, readonly []string) string {
		cc := e.ctrConfig(name, sleeper...)
		cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			MaskedPaths: masked, ReadonlyPaths: readonly}}
		return e.runContainer(t, pod, cfg, cc)
	}
	defaults := run("default", spec.DefaultMaskedPaths, spec.DefaultReadonlyPaths)
	empty := run("empty", []string{}, []string{})

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
	inDefault, inEmpty := covered(defaults), covered(empty)
	for _, p := range checked {
		if _, err := os.Stat(p); err != nil {
			continue // not in this kernel (as /proc/kcore without CONFIG_PROC_KCORE): nothing to mask
		}
		if _, ok := inDefault[p]; !ok {
			t.Errorf("default lists: nothing mounted over %s", p)
		}
		opts, ok := inEmpty[p]
		if ownUserNS && ok {
			t.Errorf("empty lists, own user namespace: %s is covered by a mount (%s)", p, opts)
		}
		if !ownUserNS && !ok {
			t.Errorf("empty lists, host's user namespace: nothing mounted over %s", p)
		}
	}
	if opts := inDefault["/proc/sys"]; !strings.HasPrefix(opts, "ro") {
		t.Errorf("default lists: /proc/sys mounted %q, want read-only", opts)
	}
	if ownUserNS {
		return
	}
	// What the masks are for, as the host's root: core_pattern cannot be
	// opened for writing (the probe writes nothing, so it changes nothing
	// where the open succeeds), and /proc/timer_list, which shows the host's
	// timers, reads nothing.
	host, err := os.ReadFile("/proc/timer_list")
	if err != nil || !strings.Contains(string(host), "Timer List") {
		t.Fatalf("the host's /proc/timer_list: %v, %.40q", err, host)
	}
	for name, ctr := range map[string]string{"default lists": defaults, "empty lists": empty} {
		r := e.exec(t, ctr, "/bin/sh", "-c", ": >>/proc/sys/kernel/core_pattern && echo opened")
		if r.stdout != "" || !strings.Contains(r.stderr, "Read-only file system") {
			t.Errorf("%s: opening core_pattern for writing: stdout %q, stderr %q, want it refused as read-only", name, r.stdout, r.stderr)
		}
		if got := e.sh(t, ctr, "/bin/busybox head -c 100 /proc/timer_list"); got != "" {
			t.Errorf("%s: /proc/timer_list reads %q, want nothing (masked)", name, got)
		}
	}
}
