package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerMountOptions checks what Status advertises as
// features.mount_options: a bind mount's mount_options (noexec, nodev,
// nosuid) are applied to it and to no other mount of the same folder, and
// an option that would loosen a mount is refused naming the field.
func TestContainerMountOptions(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !st.GetFeatures().GetMountOptions() {
		t.Errorf("Status features.mount_options is false")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := e.podConfig("mountopts")
	pod := e.runPod(t, cfg)
	cc := e.ctrConfig("opts", sleeper...)
	cc.Mounts = []*runtimeapi.Mount{
		{HostPath: dir, ContainerPath: "/mnt/plain"},
		{HostPath: dir, ContainerPath: "/mnt/opts", MountOptions: []string{"noexec", "nodev", "nosuid"}},
	}
	ctr := e.runContainer(t, pod, cfg, cc)

	options := func(target string) []string {
		for _, line := range strings.Split(e.sh(t, ctr, "cat /proc/self/mountinfo"), "\n") {
			if f := strings.Fields(line); len(f) > 5 && f[4] == target {
				return strings.Split(f[5], ",")
			}
		}
		t.Fatalf("no mount at %s", target)
		return nil
	}
	has := func(opts []string, o string) bool {
		for _, x := range opts {
			if x == o {
				return true
			}
		}
		return false
	}
	opts, plain := options("/mnt/opts"), options("/mnt/plain")
	for _, o := range []string{"noexec", "nodev", "nosuid"} {
		if !has(opts, o) {
			t.Errorf("/mnt/opts mounted %v, without %s", opts, o)
		}
	}
	if has(plain, "noexec") {
		t.Errorf("/mnt/plain (no mount_options) mounted %v", plain)
	}
	// Through a shell, which says why (exit 126: permission denied).
	if r := e.exec(t, ctr, "/bin/sh", "-c", "/mnt/plain/run.sh"); r.code != 0 || r.stdout != "ran\n" {
		t.Errorf("run.sh from /mnt/plain: exit %d, %q", r.code, r.stdout)
	}
	if r := e.exec(t, ctr, "/bin/sh", "-c", "/mnt/opts/run.sh"); r.code != 126 || r.stdout == "ran\n" {
		t.Errorf("run.sh from the noexec mount ran: exit %d, %q", r.code, r.stdout)
	}

	loose := e.ctrConfig("loose", sleeper...)
	loose.Mounts = []*runtimeapi.Mount{{HostPath: dir, ContainerPath: "/mnt/opts", MountOptions: []string{"suid"}}}
	_, err = e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: loose})
	assertCode(t, err, one(codes.InvalidArgument), "mount_options", "suid")

	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
