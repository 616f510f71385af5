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

// TestRecursiveReadOnlyMount mounts a host folder that has a submount (a
// tmpfs) read-only, once plainly and once recursive_read_only: the plain
// one leaves the submount writable, the recursive one does not. Without
// readonly or with a propagation other than private the mount is refused.
func TestRecursiveReadOnlyMount(t *testing.T) {
	t.Parallel()
	if !kernelAtLeast(t, 5, 12) {
		t.Skipf("Linux %s has no mount_setattr: the VM tier (Linux 6.1) covers recursive read-only mounts", kernelRelease(t))
	}
	e := startPodEnv(t, v1.Config{})
	src := t.TempDir()
	t.Cleanup(func() { unmountUnder(t, src) })
	if err := os.Mkdir(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustMount(t, "tmpfs", filepath.Join(src, "sub"), "tmpfs", 0)
	cfg := e.podConfig("rro")
	pod := e.runPod(t, cfg)

	for _, c := range []struct {
		name      string
		recursive bool
		subWrite  bool // writing in the submount works
	}{{"plain-ro", false, true}, {"recursive-ro", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			cc := e.ctrConfig(c.name, sleeper...)
			cc.Mounts = []*runtimeapi.Mount{{HostPath: src, ContainerPath: "/mnt/vol", Readonly: true, RecursiveReadOnly: c.recursive}}
			ctr := e.runContainer(t, pod, cfg, cc)
			if r := e.exec(t, ctr, "/bin/touch", "/mnt/vol/top"); r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
				t.Errorf("touch at the top of a read-only mount: exit %d, %q", r.code, r.stderr)
			}
			r := e.exec(t, ctr, "/bin/touch", "/mnt/vol/sub/"+c.name)
			if wrote := r.code == 0; wrote != c.subWrite {
				t.Errorf("touch in the submount: exit %d, %q; want success %v", r.code, r.stderr, c.subWrite)
			}
			if !c.subWrite && !strings.Contains(r.stderr, "Read-only file system") {
				t.Errorf("touch in the submount of a recursive read-only mount: %q, want Read-only file system", r.stderr)
			}
			e.stop(t, ctr, 0)
		})
	}

	for _, c := range []struct {
		name string
		m    *runtimeapi.Mount
		want string
	}{
		{"not-readonly", &runtimeapi.Mount{HostPath: src, ContainerPath: "/mnt/vol", RecursiveReadOnly: true}, "recursive_read_only needs readonly"},
		{"host-to-container", &runtimeapi.Mount{HostPath: src, ContainerPath: "/mnt/vol", Readonly: true, RecursiveReadOnly: true,
			Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}, "recursive_read_only needs private propagation"},
	} {
		t.Run("refused-"+c.name, func(t *testing.T) {
			cc := e.ctrConfig("refused-"+c.name, sleeper...)
			cc.Mounts = []*runtimeapi.Mount{c.m}
			_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
			assertCode(t, err, one(codes.InvalidArgument), "/mnt/vol", c.want)
			if ids := e.listContainerIDs(t, &runtimeapi.ContainerFilter{LabelSelector: cc.Labels}); len(ids) != 0 {
				t.Errorf("the refused container is listed: %v", ids)
			}
		})
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
