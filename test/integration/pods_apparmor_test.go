//lint:file-ignore SA1019 the deprecated apparmor_profile is part of what is tested

package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// appArmorEnabled tells whether this kernel enforces AppArmor: not on the
// development hosts, in the VM tier (booted with apparmor=1).
func appArmorEnabled() bool {
	b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	return err == nil && bytes.HasPrefix(b, []byte("Y"))
}

// loadAppArmorProfile loads a test profile that allows everything but what
// rule says, and unloads it when the test ends.
func loadAppArmorProfile(t *testing.T, name, rule string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	text := "profile " + name + " flags=(attach_disconnected,mediate_deleted) {\n" +
		"  file,\n  network,\n  capability,\n  signal,\n  ptrace,\n  umount,\n  " + rule + "\n}\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("apparmor_parser", "-Kr", file).CombinedOutput(); err != nil {
		t.Fatalf("apparmor_parser -Kr %s: %v: %s", file, err, out)
	}
	t.Cleanup(func() { exec.Command("apparmor_parser", "-KR", file).Run() })
}

// TestAppArmor runs containers under AppArmor profiles where the kernel
// enforces AppArmor (the VM tier): berth's default, a Localhost profile
// that denies writes under /tmp (touch fails) and one that only audits them
// (touch works), for the container's process and for one ExecSync starts
// in it. Without AppArmor (the development hosts) RuntimeDefault and
// Unconfined run unconfined, as in other runtimes. Either way a Localhost
// profile the kernel does not have is refused, leaving nothing behind.
func TestAppArmor(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("apparmor")
	pod := e.runPod(t, cfg)
	enabled := appArmorEnabled()
	t.Logf("AppArmor enabled on this kernel: %v", enabled)

	profile := func(kind runtimeapi.SecurityProfile_ProfileType, ref string) *runtimeapi.LinuxContainerSecurityContext {
		return &runtimeapi.LinuxContainerSecurityContext{Apparmor: &runtimeapi.SecurityProfile{ProfileType: kind, LocalhostRef: ref}}
	}
	const script = "cat /proc/self/attr/current 2>/dev/null || echo none; touch /tmp/x 2>&1 && echo touched"
	cases := []struct {
		name string
		sc   *runtimeapi.LinuxContainerSecurityContext
		want string
	}{
		{"runtime-default", profile(runtimeapi.SecurityProfile_RuntimeDefault, ""), "none\ntouched\n"},
		{"unconfined", profile(runtimeapi.SecurityProfile_Unconfined, ""), "none\ntouched\n"},
	}
	if enabled {
		loadAppArmorProfile(t, "berth-test-deny-write", "deny /tmp/** w,")
		loadAppArmorProfile(t, "berth-test-audit-write", "audit /tmp/** w,")
		cases = []struct {
			name string
			sc   *runtimeapi.LinuxContainerSecurityContext
			want string
		}{
			{"runtime-default", profile(runtimeapi.SecurityProfile_RuntimeDefault, ""), "berth-default (enforce)\ntouched\n"},
			{"unconfined", profile(runtimeapi.SecurityProfile_Unconfined, ""), "unconfined\ntouched\n"},
			{"deny-write", profile(runtimeapi.SecurityProfile_Localhost, "localhost/berth-test-deny-write"),
				"berth-test-deny-write (enforce)\ntouch: /tmp/x: Permission denied\n"},
			{"audit-write", profile(runtimeapi.SecurityProfile_Localhost, "berth-test-audit-write"),
				"berth-test-audit-write (enforce)\ntouched\n"},
			{"deprecated-deny-write", &runtimeapi.LinuxContainerSecurityContext{ApparmorProfile: "localhost/berth-test-deny-write"},
				"berth-test-deny-write (enforce)\ntouch: /tmp/x: Permission denied\n"},
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cc := e.ctrConfig(c.name, "/bin/sh", "-c", script)
			cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: c.sc}
			_, out := e.runToExit(t, pod, cfg, cc)
			if out != c.want {
				t.Errorf("output %q, want %q", out, c.want)
			}
			// A process ExecSync starts runs under the container's profile.
			sc := e.ctrConfig(c.name+"-exec", sleeper...)
			sc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: c.sc}
			id := e.runContainer(t, pod, cfg, sc)
			if got := e.exec(t, id, "/bin/sh", "-c", script); got.stdout != c.want {
				t.Errorf("exec: %+v, want stdout %q", got, c.want)
			}
			e.stop(t, id, 0)
		})
	}

	t.Run("refused-localhost", func(t *testing.T) {
		cc := e.ctrConfig("refused", "true")
		cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: profile(runtimeapi.SecurityProfile_Localhost, "berth-test-not-loaded")}
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		want := "not loaded"
		if !enabled {
			want = "AppArmor is not enabled"
		}
		assertCode(t, err, one(codes.InvalidArgument), "apparmor", "berth-test-not-loaded", want)
		if ids := e.listContainerIDs(t, &runtimeapi.ContainerFilter{LabelSelector: cc.Labels}); len(ids) != 0 {
			t.Errorf("the refused container is listed: %v", ids)
		}
	})
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
