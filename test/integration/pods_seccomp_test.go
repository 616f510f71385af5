//lint:file-ignore SA1019 the deprecated seccomp_profile_path is part of what is tested

package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// seccompStatus is what the script prints: the Seccomp line of the
// container's own /proc/self/status.
const seccompStatus = "grep ^Seccomp: /proc/self/status"

func runtimeDefault() *runtimeapi.SecurityProfile {
	return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
}

func localhostProfile(path string) *runtimeapi.SecurityProfile {
	return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: path}
}

// writeProfile writes a seccomp profile that allows everything but names,
// which fail with EPERM, and returns its path.
func writeProfile(t *testing.T, name string, names ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	body := `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["` + strings.Join(names, `", "`) +
		`"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}`
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSeccomp runs containers under berth's default profile, under none and
// under Localhost profiles, and checks the filter as the process sees it
// (/proc/self/status, calls that fail), for ExecSync too; and that a missing
// or broken profile is refused at create, naming the path, leaving nothing.
func TestSeccomp(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("seccomp")
	// Privileged: the "privileged" case runs a privileged container, which
	// only a privileged pod may hold.
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{Privileged: true}
	pod := e.runPod(t, cfg)
	chmodProfile := writeProfile(t, "no-chmod.json", "chmod", "fchmod", "fchmodat", "fchmodat2")
	hostnameProfile := writeProfile(t, "no-sethostname.json", "sethostname")
	ctr := func(name string, sc *runtimeapi.LinuxContainerSecurityContext, script string) *runtimeapi.ContainerConfig {
		c := e.ctrConfig(name, "/bin/sh", "-c", script)
		c.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: sc}
		return c
	}

	for _, c := range []struct {
		name   string
		sc     *runtimeapi.LinuxContainerSecurityContext
		script string
		want   string
	}{
		{"runtime-default", &runtimeapi.LinuxContainerSecurityContext{Seccomp: runtimeDefault()},
			seccompStatus + "; unshare -U true 2>&1 || echo unshare refused",
			"Seccomp:\t2\nunshare: unshare(0x10000000): Operation not permitted\nunshare refused\n"},
		// runc loads the filter before it drops root: what it does after must pass.
		{"runtime-default-non-root", &runtimeapi.LinuxContainerSecurityContext{Seccomp: runtimeDefault(),
			RunAsUser: &runtimeapi.Int64Value{Value: 1002}}, "id -u; " + seccompStatus, "1002\nSeccomp:\t2\n"},
		{"runtime-default-no-new-privs", &runtimeapi.LinuxContainerSecurityContext{Seccomp: runtimeDefault(), NoNewPrivs: true,
			RunAsUser: &runtimeapi.Int64Value{Value: 1002}}, "id -u; " + seccompStatus, "1002\nSeccomp:\t2\n"},
		{"deprecated-docker-default", &runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "docker/default"},
			seccompStatus, "Seccomp:\t2\n"},
		{"unset", nil, seccompStatus + "; chmod 400 / && echo chmod ok", "Seccomp:\t0\nchmod ok\n"},
		{"unconfined", &runtimeapi.LinuxContainerSecurityContext{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}},
			seccompStatus, "Seccomp:\t0\n"},
		{"privileged", &runtimeapi.LinuxContainerSecurityContext{Privileged: true, Seccomp: localhostProfile(hostnameProfile)},
			seccompStatus + "; hostname x && hostname", "Seccomp:\t0\nx\n"},
		{"localhost-chmod", &runtimeapi.LinuxContainerSecurityContext{Seccomp: localhostProfile(chmodProfile)},
			seccompStatus + "; chmod 400 / 2>&1", "Seccomp:\t2\nchmod: /: Operation not permitted\n"},
		{"deprecated-localhost-chmod", &runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "localhost/" + chmodProfile},
			"chmod 400 / 2>&1", "chmod: /: Operation not permitted\n"},
		{"localhost-sethostname-sys-admin", &runtimeapi.LinuxContainerSecurityContext{Seccomp: localhostProfile(hostnameProfile),
			Capabilities: &runtimeapi.Capability{AddCapabilities: []string{"SYS_ADMIN"}}},
			"hostname y 2>&1; hostname", "hostname: sethostname: Operation not permitted\nseccomp\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, out := e.runToExit(t, pod, cfg, ctr(c.name, c.sc, c.script))
			if out != c.want {
				t.Errorf("output %q, want %q", out, c.want)
			}
		})
	}

	// ExecSync joins the container under the container's own filter.
	id := e.runContainer(t, pod, cfg, ctr("exec", &runtimeapi.LinuxContainerSecurityContext{Seccomp: localhostProfile(chmodProfile)},
		"exec sleep 100000"))
	const execScript = seccompStatus + "; chmod 400 / 2>&1 || true"
	const execWant = "Seccomp:\t2\nchmod: /: Operation not permitted\n"
	if got := e.exec(t, id, "/bin/sh", "-c", execScript); got.stdout != execWant {
		t.Errorf("ExecSync under a Localhost profile: %+v", got)
	}
	// So does a streamed Exec (kubectl exec).
	resp, err := e.d.Runtime.Exec(t.Context(), &runtimeapi.ExecRequest{ContainerId: id, Cmd: []string{"/bin/sh", "-c", execScript}, Stdout: true})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	x, err := executors[0].new(resp.Url)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := x.StreamWithContext(t.Context(), remotecommand.StreamOptions{Stdout: &out}); err != nil || out.String() != execWant {
		t.Errorf("streamed Exec under a Localhost profile: %q, %v; want %q", out.String(), err, execWant)
	}
	e.stop(t, id, 0)

	broken := filepath.Join(t.TempDir(), "broken.json")
	if err := os.WriteFile(broken, []byte(`{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [`), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.json")
	for _, c := range []struct {
		name string
		sc   *runtimeapi.LinuxContainerSecurityContext
		want []string
	}{
		{"missing", &runtimeapi.LinuxContainerSecurityContext{Seccomp: localhostProfile(missing)}, []string{missing, "no such file"}},
		{"deprecated-missing", &runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "localhost/" + missing}, []string{missing, "no such file"}},
		{"broken", &runtimeapi.LinuxContainerSecurityContext{Seccomp: localhostProfile(broken)}, []string{broken, "unexpected end of JSON input"}},
		{"bad-deprecated", &runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "default"}, []string{"seccomp_profile_path", `"default"`}},
	} {
		t.Run("refused-"+c.name, func(t *testing.T) {
			cc := ctr("refused-"+c.name, c.sc, "true")
			_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
			assertCode(t, err, one(codes.InvalidArgument), c.want...)
			if ids := e.listContainerIDs(t, &runtimeapi.ContainerFilter{LabelSelector: cc.Labels}); len(ids) != 0 {
				t.Errorf("the refused container is listed: %v", ids)
			}
		})
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestPodSeccomp checks the pod-level seccomp field: it confines the pod's
// pause (PID 1 of a shared PID namespace, seen from a container), and a
// missing Localhost profile fails RunPodSandbox, leaving nothing behind.
func TestPodSeccomp(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	for _, c := range []struct {
		name string
		sc   *runtimeapi.LinuxSandboxSecurityContext
		want string
	}{
		{"pod-runtime-default", &runtimeapi.LinuxSandboxSecurityContext{Seccomp: runtimeDefault()}, "Seccomp:\t2\n"},
		{"pod-unset", &runtimeapi.LinuxSandboxSecurityContext{}, "Seccomp:\t0\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.podConfig(c.name)
			c.sc.NamespaceOptions = &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_POD}
			cfg.Linux.SecurityContext = c.sc
			pod := e.runPod(t, cfg)
			_, out := e.runToExit(t, pod, cfg, e.ctrConfig("look-"+c.name, "/bin/sh", "-c", "grep ^Seccomp: /proc/1/status"))
			if out != c.want {
				t.Errorf("the pause's seccomp status %q, want %q", out, c.want)
			}
			e.removePod(t, pod)
		})
	}
	t.Run("refused-missing-profile", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "missing.json")
		cfg := e.podConfig("pod-missing-profile")
		cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{Seccomp: localhostProfile(missing)}
		_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		assertCode(t, err, one(codes.InvalidArgument), "seccomp", missing, "no such file")
	})
	e.assertNoLeaks(t)
}
