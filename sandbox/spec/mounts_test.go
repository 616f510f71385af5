package spec

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func podFiles(t *testing.T, in *Input) {
	dir := t.TempDir()
	in.HostsPath = filepath.Join(dir, "hosts")
	in.ResolvPath = filepath.Join(dir, "resolv.conf")
	in.HostnamePath = filepath.Join(dir, "hostname")
	in.ShmPath = filepath.Join(dir, "shm")
}

func wantMount(t *testing.T, ms []specs.Mount, dst, typ, src string, opts ...string) {
	t.Helper()
	m := findMount(ms, dst)
	if m == nil {
		t.Fatalf("no mount at %s in %+v", dst, ms)
	}
	if m.Type != typ || (src != "" && m.Source != src) || !slices.Equal(m.Options, opts) {
		t.Fatalf("mount %s = %+v, want type %s source %s options %q", dst, *m, typ, src, opts)
	}
}

// In a pod with a user namespace of its own, the CRI mounts (volumes, and
// /etc/hosts when the kubelet sends it) are idmapped through it; berth's pod
// files are not, whatever the filesystem of its state folder can do.
func TestUserNSMounts(t *testing.T) {
	in := baseInput(t)
	podFiles(t, &in)
	m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1000000, Size: 65536}}
	in.UserNS, in.UIDMappings, in.GIDMappings = "/run/berth/ns/user-1", m, m
	vol := t.TempDir()
	in.Config.Mounts = []*runtimeapi.Mount{{HostPath: vol, ContainerPath: "/vol"}, {HostPath: vol, ContainerPath: "/etc/hosts"}}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Linux.UIDMappings, m) || !slices.Equal(s.Linux.GIDMappings, m) {
		t.Errorf("linux mappings %v %v, want %v", s.Linux.UIDMappings, s.Linux.GIDMappings, m)
	}
	for _, dst := range []string{"/vol", "/etc/hosts", "/etc/resolv.conf", "/etc/hostname", "/dev/shm"} {
		ms := findMount(s.Mounts, dst)
		if ms == nil {
			t.Fatalf("no mount at %s", dst)
		}
		cri := dst == "/vol" || dst == "/etc/hosts"
		if idmapped := ms.UIDMappings != nil || ms.GIDMappings != nil; idmapped != cri {
			t.Errorf("%s (source %s): idmapped %v, want %v", dst, ms.Source, idmapped, cri)
		}
		if cri && (!slices.Equal(ms.UIDMappings, m) || !slices.Equal(ms.GIDMappings, m)) {
			t.Errorf("%s: mappings %v %v, want the pod's %v", dst, ms.UIDMappings, ms.GIDMappings, m)
		}
	}
}

func TestDefaultMounts(t *testing.T) {
	in := baseInput(t)
	podFiles(t, &in)
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	ms := s.Mounts
	wantMount(t, ms, "/proc", "proc", "proc", "nosuid", "noexec", "nodev")
	wantMount(t, ms, "/dev", "tmpfs", "tmpfs", "nosuid", "strictatime", "mode=755", "size=65536k")
	wantMount(t, ms, "/dev/pts", "devpts", "devpts", "nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5")
	wantMount(t, ms, "/dev/mqueue", "mqueue", "mqueue", "nosuid", "noexec", "nodev")
	wantMount(t, ms, "/sys", "sysfs", "sysfs", "nosuid", "noexec", "nodev", "ro")
	wantMount(t, ms, "/sys/fs/cgroup", "cgroup", "cgroup", "nosuid", "noexec", "nodev", "relatime", "ro")
	wantMount(t, ms, "/dev/shm", "bind", in.ShmPath, "rbind", "rprivate", "rw")
	wantMount(t, ms, "/etc/hosts", "bind", in.HostsPath, "rbind", "rprivate", "rw")
	wantMount(t, ms, "/etc/resolv.conf", "bind", in.ResolvPath, "rbind", "rprivate", "rw")
	wantMount(t, ms, "/etc/hostname", "bind", in.HostnamePath, "rbind", "rprivate", "rw")
	if len(ms) != 10 {
		t.Fatalf("%d mounts: %+v", len(ms), ms)
	}
	if s.Linux.RootfsPropagation != "" {
		t.Fatalf("rootfs propagation %q", s.Linux.RootfsPropagation)
	}

	// Read-only rootfs: the pod's /etc files follow, /dev/shm stays writable.
	secCtx(&in).ReadonlyRootfs = true
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	wantMount(t, s.Mounts, "/etc/hosts", "bind", in.HostsPath, "rbind", "rprivate", "ro")
	wantMount(t, s.Mounts, "/etc/resolv.conf", "bind", in.ResolvPath, "rbind", "rprivate", "ro")
	wantMount(t, s.Mounts, "/etc/hostname", "bind", in.HostnamePath, "rbind", "rprivate", "ro")
	wantMount(t, s.Mounts, "/dev/shm", "bind", in.ShmPath, "rbind", "rprivate", "rw")

	// Privileged: /sys and the cgroup fs are writable.
	secCtx(&in).Privileged = true
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	wantMount(t, s.Mounts, "/sys", "sysfs", "sysfs", "nosuid", "noexec", "nodev")
	wantMount(t, s.Mounts, "/sys/fs/cgroup", "cgroup", "cgroup", "nosuid", "noexec", "nodev", "relatime")
}

func TestShmWithoutPodShm(t *testing.T) {
	in := baseInput(t)
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	wantMount(t, s.Mounts, "/dev/shm", "tmpfs", "shm", "nosuid", "noexec", "nodev", "mode=1777", "size=65536k")
	for _, p := range []string{"/etc/hosts", "/etc/resolv.conf", "/etc/hostname"} {
		if findMount(s.Mounts, p) != nil {
			t.Fatalf("%s mounted without a pod file", p)
		}
	}
	in.IPCNS, in.HostIPC = "", true
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	wantMount(t, s.Mounts, "/dev/shm", "bind", "/dev/shm", "rbind", "rprivate", "rw")
}

func TestCRIMounts(t *testing.T) {
	host := t.TempDir()
	mustMkdir(t, filepath.Join(host, "data/sub"))
	mustMkdir(t, filepath.Join(host, "real"))
	symlink(t, filepath.Join(host, "real"), filepath.Join(host, "link"))
	writeFile(t, filepath.Join(host, "myhosts"), "127.0.0.1 x\n")

	in := baseInput(t)
	podFiles(t, &in)
	in.Config.Mounts = []*runtimeapi.Mount{
		{ContainerPath: "/data/sub", HostPath: filepath.Join(host, "data/sub"), Readonly: true},
		{ContainerPath: "/data", HostPath: filepath.Join(host, "data"), Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
		{ContainerPath: "/shared/", HostPath: filepath.Join(host, "real"), Propagation: runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL, SelinuxRelabel: true},
		{ContainerPath: "/linked", HostPath: filepath.Join(host, "link")},
		{ContainerPath: "/etc/hosts", HostPath: filepath.Join(host, "myhosts"), Readonly: true},
		{ContainerPath: "/rro", HostPath: filepath.Join(host, "real"), Readonly: true, RecursiveReadOnly: true, MountOptions: []string{"noexec"}},
	}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	ms := s.Mounts
	wantMount(t, ms, "/data/sub", "bind", filepath.Join(host, "data/sub"), "rbind", "rprivate", "ro")
	wantMount(t, ms, "/data", "bind", filepath.Join(host, "data"), "rbind", "rslave", "rw")
	wantMount(t, ms, "/shared", "bind", filepath.Join(host, "real"), "rbind", "rshared", "rw")
	wantMount(t, ms, "/linked", "bind", filepath.Join(host, "real"), "rbind", "rprivate", "rw")
	wantMount(t, ms, "/etc/hosts", "bind", filepath.Join(host, "myhosts"), "rbind", "rprivate", "ro")
	wantMount(t, ms, "/rro", "bind", filepath.Join(host, "real"), "rbind", "rprivate", "ro", "rro", "noexec")
	n := 0
	for _, m := range ms {
		if m.Destination == "/etc/hosts" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d mounts at /etc/hosts", n)
	}
	if s.Linux.RootfsPropagation != "rshared" {
		t.Fatalf("rootfs propagation %q, want rshared", s.Linux.RootfsPropagation)
	}

	// Parents before children, everywhere.
	index := map[string]int{}
	for i, m := range ms {
		index[m.Destination] = i
	}
	for child, parent := range map[string]string{"/data/sub": "/data", "/dev/pts": "/dev", "/dev/shm": "/dev", "/sys/fs/cgroup": "/sys"} {
		if index[parent] > index[child] {
			t.Errorf("%s mounted after %s", parent, child)
		}
	}

	// Host-to-container alone asks for a slave rootfs.
	in.Config.Mounts = in.Config.Mounts[:2]
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.RootfsPropagation != "rslave" {
		t.Fatalf("rootfs propagation %q, want rslave", s.Linux.RootfsPropagation)
	}
}

func TestCRIMountOverridesDev(t *testing.T) {
	in := baseInput(t)
	host := t.TempDir()
	in.Config.Mounts = []*runtimeapi.Mount{{ContainerPath: "/dev", HostPath: host}}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Mounts {
		if m.Destination == "/dev/pts" || m.Destination == "/dev/shm" || (m.Destination == "/dev" && m.Type != "bind") {
			t.Fatalf("default %s kept under a CRI /dev", m.Destination)
		}
	}
}

func TestCRIMountErrors(t *testing.T) {
	host := t.TempDir()
	missing := filepath.Join(host, "nope")
	for _, tc := range []struct {
		m   *runtimeapi.Mount
		err []string
	}{
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: missing}, []string{missing, "does not exist"}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: filepath.Join(missing, "deeper")}, []string{"deeper", "does not exist"}},
		{&runtimeapi.Mount{ContainerPath: "rel", HostPath: host}, []string{`"rel"`}},
		{&runtimeapi.Mount{ContainerPath: "/", HostPath: host}, []string{`"/"`}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: "relative"}, []string{`"relative"`}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: host, RecursiveReadOnly: true}, []string{"recursive_read_only"}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: host, Readonly: true, RecursiveReadOnly: true,
			Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}, []string{"recursive_read_only"}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: host, Propagation: 9}, []string{"propagation"}},
		{&runtimeapi.Mount{ContainerPath: "/x", Image: &runtimeapi.ImageSpec{Image: "busybox"}}, []string{"mount /x", `image "busybox" is not mounted`}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: host, Image: &runtimeapi.ImageSpec{Image: "busybox"}}, []string{"mount /x", "host_path", "image"}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: host, ImageSubPath: "a"}, []string{"mount /x", `image_sub_path "a" needs an image`}},
		{&runtimeapi.Mount{ContainerPath: "/x", HostPath: host, UidMappings: []*runtimeapi.IDMapping{{HostId: 1, Length: 1}}}, []string{"uid_mappings and gid_mappings must be those of the pod"}},
	} {
		in := baseInput(t)
		in.Config.Mounts = []*runtimeapi.Mount{tc.m}
		_, err := Generate(in)
		wantErr(t, err, tc.err...)
	}
}

// TestImageMounts: an image mount binds the image's mounted root, or a
// sub-path resolved inside it, always read-only and never idmapped again;
// a sub-path that is missing or climbs out is refused naming it, and a
// symlink in the image cannot lead out of it.
func TestImageMounts(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir() // stands in for the image the sandbox mounted
	for _, d := range []string{"models/v1", "data"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"current": "/models/v1",                            // absolute: the image's /models/v1
		"up":      "../../../../../../../../../../../data", // ".." stops at the image's root
		"out":     outside,                                 // absolute: looked up in the image, where it is not
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		sub, want string
		err       []string
	}{
		{sub: "", want: root},
		{sub: "models/v1", want: filepath.Join(root, "models/v1")},
		{sub: "current", want: filepath.Join(root, "models/v1")},
		{sub: "up", want: filepath.Join(root, "data")},
		{sub: "models/../data", err: []string{`image_sub_path "models/../data"`, `without ".."`}},
		{sub: "../" + filepath.Base(outside), err: []string{`without ".."`}},
		{sub: "/models", err: []string{`image_sub_path "/models"`, "relative"}},
		{sub: "out/secret", err: []string{`image_sub_path "out/secret"`, "not found in the image"}},
		{sub: "missing", err: []string{`image_sub_path "missing"`, "not found in the image"}},
	} {
		t.Run(tc.sub, func(t *testing.T) {
			bothResolvers(t, func(t *testing.T) {
				in := baseInput(t)
				m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
				in.UserNS, in.UIDMappings, in.GIDMappings = "/proc/self/ns/user", m, m
				in.Config.Mounts = []*runtimeapi.Mount{{ContainerPath: "/m", Image: &runtimeapi.ImageSpec{Image: "sha256:abc"}, ImageSubPath: tc.sub}}
				in.ImageVolumes = map[int]string{0: root}
				s, err := Generate(in)
				if tc.err != nil {
					wantErr(t, err, append(tc.err, "mount /m", `image "sha256:abc"`)...)
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				bm := findMount(s.Mounts, "/m")
				if bm == nil {
					t.Fatalf("no mount at /m: %+v", s.Mounts)
				}
				want, _ := filepath.EvalSymlinks(tc.want)
				if bm.Source != want || !slices.Contains(bm.Options, "ro") || slices.Contains(bm.Options, "rw") {
					t.Errorf("mount %+v, want a read-only bind of %s", bm, want)
				}
				if bm.UIDMappings != nil || bm.GIDMappings != nil {
					t.Errorf("image volume idmapped again by the runtime: %+v", bm)
				}
			})
		})
	}
}
