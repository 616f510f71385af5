package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/test/harness"
)

// confinementScript prints, for the process running it and then for the
// container's own process (PID 1 of its PID namespace), what confines
// each: identity, capability sets, no_new_privs, seccomp, cgroups, limits,
// oom_score_adj. The exec must print the same twice.
const confinementScript = `for p in self 1; do
  grep -E '^(Uid|Gid|Groups|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/$p/status
  cat /proc/$p/cgroup /proc/$p/limits /proc/$p/oom_score_adj
  echo ---
done`

// TestExecConfinement: a process ExecSync starts runs under the container's
// confinement, as berth-exec-init applies it (the container's settings and
// seccomp filter are saved in its bundle at create): the same identity,
// capabilities, no_new_privs, seccomp filter, cgroups, rlimits and
// oom_score_adj as the container's process, its working folder and
// environment; and it is refused what they refuse: a call the seccomp
// profile denies, an operation its dropped capability guards.
func TestExecConfinement(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath, "FROM_IMAGE=image"}, WorkingDir: "/tmp"})
	cfg := e.podConfig("confined")
	pod := e.runPod(t, cfg)
	for _, c := range []struct {
		name string
		sc   *runtimeapi.LinuxContainerSecurityContext
		// check runs in the exec; want is its output.
		check, want string
	}{
		// A user (the image names it, and a group of its own): its ids and
		// groups; no_new_privs; the default profile
		// refuses unshare (an unprivileged user may make a user namespace).
		{"user", &runtimeapi.LinuxContainerSecurityContext{
			Seccomp:            runtimeDefault(),
			RunAsUser:          &runtimeapi.Int64Value{Value: 1002},
			RunAsGroup:         &runtimeapi.Int64Value{Value: 3003},
			SupplementalGroups: []int64{4004},
			NoNewPrivs:         true,
		},
			"id; grep NoNewPrivs /proc/self/status; unshare -U true 2>&1 || echo unshare refused; echo $FROM_IMAGE $FROM_CRI; pwd",
			"uid=1002(berth) gid=3003 groups=1004(extra),3003,4004\nNoNewPrivs:\t1\nunshare: unshare(0x10000000): Operation not permitted\nunshare refused\nimage cri\n/tmp\n"},
		// Root without CAP_CHOWN: its own file it may write, not give away.
		{"root-without-chown", &runtimeapi.LinuxContainerSecurityContext{
			Seccomp:      runtimeDefault(),
			Capabilities: &runtimeapi.Capability{DropCapabilities: []string{"CHOWN"}},
		},
			"id -u; touch f && echo wrote; chown 1 f 2>&1 || echo chown refused",
			"0\nwrote\nchown: f: Operation not permitted\nchown refused\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The command marks its start: StartContainer returns once
			// the container's init has begun the execve of its command
			// (the exec fifo's writer closes on exec), before the kernel
			// commits the command's credentials, so for a moment PID 1
			// still holds the capabilities a non-root command loses then.
			cc := e.ctrConfig(c.name, "/bin/sh", "-c", "touch /tmp/started; exec sleep 100000")
			cc.Envs = []*runtimeapi.KeyValue{{Key: "FROM_CRI", Value: []byte("cri")}}
			// A PID namespace of its own: its process is PID 1 there.
			c.sc.NamespaceOptions = &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}
			cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: c.sc}
			id := e.runContainer(t, pod, cfg, cc)
			started := fmt.Sprintf("/proc/%d/root/tmp/started", e.ctrPID(t, id))
			if !eventually(10*time.Second, func() bool { _, err := os.Stat(started); return err == nil }) {
				t.Fatalf("the container's command did not start (%s)", started)
			}
			bundle := filepath.Join(e.d.State, "pods", pod, shim.Containers, id)
			for _, f := range []string{shim.ExecInitFile, shim.SeccompFile} {
				if _, err := os.Stat(filepath.Join(bundle, f)); err != nil {
					t.Fatalf("the exec init's %s: %v (execs would go through libcontainer)", f, err)
				}
			}
			got := e.exec(t, id, "/bin/sh", "-c", confinementScript)
			self, ctr, ok := strings.Cut(got.stdout, "---\n")
			if !ok || got.code != 0 || self != strings.TrimSuffix(ctr, "---\n") || !strings.Contains(self, "Seccomp:\t2\n") {
				t.Errorf("the exec's confinement (then the container's):\n%s\nstderr %q, code %d", got.stdout, got.stderr, got.code)
			}
			if got := e.exec(t, id, "/bin/sh", "-c", c.check); got.stdout != c.want {
				t.Errorf("exec: %+v, want stdout %q", got, c.want)
			}
		})
	}
}
