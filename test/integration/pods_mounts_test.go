package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerBindMounts checks bind mounts of host paths from both sides:
// read-write and read-only, a file, a host path that is a symlink, a host
// path that does not exist, and each propagation mode with mounts made on
// the host and in the container after it started.
func TestContainerBindMounts(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	base := t.TempDir()
	t.Cleanup(func() { unmountUnder(t, base) })
	mkfile := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mkfile(filepath.Join(base, "rw", "hello"), "from host")
	mkfile(filepath.Join(base, "ro", "hello"), "read me")
	mkfile(filepath.Join(base, "target", "hello"), "via the link")
	mkfile(filepath.Join(base, "app.conf"), "key = value\n")
	if err := os.Symlink("target", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}

	cfg := e.podConfig("mounts")
	// Privileged: the propagation cases run a privileged container, which
	// only a privileged pod may hold.
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{Privileged: true}
	pod := e.runPod(t, cfg)

	t.Run("plain", func(t *testing.T) {
		mounts := []*runtimeapi.Mount{
			{HostPath: filepath.Join(base, "rw"), ContainerPath: "/mnt/rw"},
			{HostPath: filepath.Join(base, "ro"), ContainerPath: "/mnt/ro", Readonly: true},
			{HostPath: filepath.Join(base, "link"), ContainerPath: "/mnt/link"},
			{HostPath: filepath.Join(base, "app.conf"), ContainerPath: "/etc/app.conf", Readonly: true},
		}
		cc := e.ctrConfig("plain", sleeper...)
		cc.Mounts = mounts
		ctr := e.runContainer(t, pod, cfg, cc)

		for path, want := range map[string]string{
			"/mnt/rw/hello": "from host", "/mnt/ro/hello": "read me",
			"/mnt/link/hello": "via the link", "/etc/app.conf": "key = value",
		} {
			if got := e.sh(t, ctr, "cat "+path); got != want {
				t.Errorf("%s in the container = %q, want %q", path, got, want)
			}
		}
		// Read-write: both ways.
		e.sh(t, ctr, "echo from container > /mnt/rw/back")
		if b, err := os.ReadFile(filepath.Join(base, "rw", "back")); err != nil || string(b) != "from container\n" {
			t.Errorf("host sees %q, %v for the file the container wrote", b, err)
		}
		mkfile(filepath.Join(base, "rw", "late"), "written after start")
		if got := e.sh(t, ctr, "cat /mnt/rw/late"); got != "written after start" {
			t.Errorf("container sees %q for a file the host wrote after start", got)
		}
		// Read-only: a write fails, on the folder and on the file.
		for _, script := range []string{"touch /mnt/ro/new", "echo x >> /etc/app.conf", "rm /mnt/ro/hello"} {
			r := e.exec(t, ctr, "/bin/sh", "-c", script)
			if r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
				t.Errorf("%q on a read-only mount: exit %d, stderr %q", script, r.code, r.stderr)
			}
		}
		if _, err := os.Stat(filepath.Join(base, "ro", "new")); !os.IsNotExist(err) {
			t.Errorf("the read-only mount let a file through: %v", err)
		}
		if b, _ := os.ReadFile(filepath.Join(base, "app.conf")); string(b) != "key = value\n" {
			t.Errorf("the read-only file changed: %q", b)
		}
		// The symlink was resolved on the host: the container sees the
		// target folder, and a file made there through the mount lands in it.
		e.sh(t, ctr, "touch /mnt/link/made-inside")
		if _, err := os.Stat(filepath.Join(base, "target", "made-inside")); err != nil {
			t.Errorf("file made through the symlinked mount: %v", err)
		}
		if fi, err := os.Lstat(filepath.Join(base, "link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("the host symlink was replaced: %v %v", fi, err)
		}
		// Status reports the mounts as given (the symlink, not its target).
		st := e.status(t, ctr)
		if !slices.EqualFunc(st.Mounts, mounts, func(a, b *runtimeapi.Mount) bool { return proto.Equal(a, b) }) {
			t.Errorf("ContainerStatus mounts = %v, want %v", st.Mounts, mounts)
		}
	})

	t.Run("missing-host-path", func(t *testing.T) {
		before := e.listContainerIDs(t, &runtimeapi.ContainerFilter{PodSandboxId: pod})
		missing := filepath.Join(base, "no", "such", "dir")
		cc := e.ctrConfig("missing", sleeper...)
		cc.Mounts = []*runtimeapi.Mount{{HostPath: missing, ContainerPath: "/mnt/missing"}}
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		assertCode(t, err, one(codes.InvalidArgument), missing)
		if after := e.listContainerIDs(t, &runtimeapi.ContainerFilter{PodSandboxId: pod}); !sameSet(after, before) {
			t.Errorf("containers after the refused create: %v, want %v", after, before)
		}
		for _, dir := range []string{filepath.Join(e.d.Root, "containers"), filepath.Join(e.d.State, "pods", pod, "containers")} {
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, en := range entries {
				if en.Name() != "pause" {
					names = append(names, en.Name())
				}
			}
			if !sameSet(names, before) {
				t.Errorf("%s holds %v after the refused create, want %v", dir, names, before)
			}
		}
		if _, err := os.Stat(missing); !os.IsNotExist(err) {
			t.Errorf("the missing host path was created: %v", err)
		}
	})

	t.Run("propagation", func(t *testing.T) {
		for _, c := range []struct {
			mode                 runtimeapi.MountPropagation
			hostToCtr, ctrToHost bool
		}{
			{runtimeapi.MountPropagation_PROPAGATION_PRIVATE, false, false},
			{runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER, true, false},
			{runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL, true, true},
		} {
			t.Run(c.mode.String(), func(t *testing.T) {
				// The kubelet keeps its pods folder a shared mount; so does
				// the test with the source.
				src := filepath.Join(base, strings.ToLower(c.mode.String()))
				if err := os.MkdirAll(src, 0o755); err != nil {
					t.Fatal(err)
				}
				mustMount(t, src, src, "", unix.MS_BIND)
				mustMount(t, "", src, "", unix.MS_SHARED)

				cc := e.ctrConfig(strings.ToLower(c.mode.String()), sleeper...)
				cc.Mounts = []*runtimeapi.Mount{{HostPath: src, ContainerPath: "/mnt/vol", Propagation: c.mode}}
				// Privileged, to mount inside (the kubelet asks it for
				// bidirectional mounts anyway).
				cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}}
				ctr := e.runContainer(t, pod, cfg, cc)

				// Host → container: a tmpfs mounted under the source after
				// the start.
				if err := os.Mkdir(filepath.Join(src, "fromhost"), 0o755); err != nil {
					t.Fatal(err)
				}
				mustMount(t, "tmpfs", filepath.Join(src, "fromhost"), "tmpfs", 0)
				mkfile(filepath.Join(src, "fromhost", "marker"), "host mount")
				r := e.exec(t, ctr, "/bin/cat", "/mnt/vol/fromhost/marker")
				if seen := r.code == 0 && r.stdout == "host mount"; seen != c.hostToCtr {
					t.Errorf("a host mount under the source: container sees it %v, want %v (cat: exit %d, %q %q)",
						seen, c.hostToCtr, r.code, r.stdout, r.stderr)
				}

				// Container → host: a tmpfs mounted under the mount inside.
				e.sh(t, ctr, "mkdir /mnt/vol/fromctr && /bin/busybox mount -t tmpfs tmpfs /mnt/vol/fromctr && echo ctr mount > /mnt/vol/fromctr/marker")
				b, err := os.ReadFile(filepath.Join(src, "fromctr", "marker"))
				if seen := err == nil && string(b) == "ctr mount\n"; seen != c.ctrToHost {
					t.Errorf("a container mount under the volume: host sees it %v, want %v (%q, %v)", seen, c.ctrToHost, b, err)
				}
				if seen := slices.Contains(mountPoints(), filepath.Join(src, "fromctr")); seen != c.ctrToHost {
					t.Errorf("the container's mount is in the host's mount table: %v, want %v", seen, c.ctrToHost)
				}
				if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: ctr}); err != nil {
					t.Fatal(err)
				}
				unmountUnder(t, src)
			})
		}
	})

	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

func mustMount(t *testing.T, source, target, fstype string, flags uintptr) {
	t.Helper()
	if err := unix.Mount(source, target, fstype, flags, ""); err != nil {
		t.Fatalf("mount %s on %s: %v", source, target, err)
	}
}

// unmountUnder unmounts every mount at or below dir, deepest first.
func unmountUnder(t *testing.T, dir string) {
	t.Helper()
	var ms []string
	for _, m := range mountPoints() {
		if m == dir || strings.HasPrefix(m, dir+"/") {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b string) int { return len(b) - len(a) })
	for _, m := range ms {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			t.Errorf("unmount %s: %v", m, err)
		}
	}
}
