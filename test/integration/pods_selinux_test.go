package integration

import (
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSELinuxOptions runs a pod and a container with SELinux options and a
// selinux_relabel mount. berth does not label containers: where SELinux is
// off (as on the test hosts) the fields have no effect and the container
// runs, with its mount; where it is on they are refused, naming the field.
func TestSELinuxOptions(t *testing.T) {
	t.Parallel()
	_, err := os.Stat("/sys/fs/selinux/enforce")
	selinuxOn := err == nil
	e := startPodEnv(t, v1.Config{})
	label := &runtimeapi.SELinuxOption{User: "system_u", Role: "system_r", Type: "container_t", Level: "s0:c1,c2"}
	src := t.TempDir()
	if err := os.WriteFile(src+"/marker", []byte("relabelled"), 0o644); err != nil {
		t.Fatal(err)
	}

	cfg := e.podConfig("selinux")
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{SelinuxOptions: label}
	if selinuxOn {
		_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		assertCode(t, err, one(codes.FailedPrecondition), "linux.security_context.selinux_options")
		cfg.Linux.SecurityContext = nil
	}
	pod := e.runPod(t, cfg)

	cc := e.ctrConfig("labelled", sleeper...)
	cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{SelinuxOptions: label}}
	cc.Mounts = []*runtimeapi.Mount{{HostPath: src, ContainerPath: "/mnt/vol", SelinuxRelabel: true}}
	if selinuxOn {
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		assertCode(t, err, one(codes.FailedPrecondition), "/mnt/vol", "selinux_relabel")
	} else {
		ctr := e.runContainer(t, pod, cfg, cc)
		if r := e.exec(t, ctr, "/bin/cat", "/mnt/vol/marker"); r.code != 0 || strings.TrimSpace(r.stdout) != "relabelled" {
			t.Errorf("cat in the selinux_relabel mount: exit %d, %q, %q", r.code, r.stdout, r.stderr)
		}
		e.stop(t, ctr, 0)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
