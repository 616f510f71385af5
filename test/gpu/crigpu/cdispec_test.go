package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// linkToDevNull stands for mknod without privileges: discover follows the
// link and finds a character device (1:3).
func linkToDevNull(path string, _, _ uint32) error { return os.Symlink("/dev/null", path) }

// fakeRoot lays out the fake driver in a temp folder.
func fakeRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "host")
	if err := writeFakeDriver(root, []byte("fake libcuda"), linkToDevNull); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestSpecOfFakeDriver: the spec made for a driver layout is one the CDI
// library (the one berthd uses) loads, lists and applies: every node with
// its numbers and cgroup rule, every library and nvidia-smi bound
// read-only at its host path (once, though /lib is /usr/lib), and the
// loader's path.
func TestSpecOfFakeDriver(t *testing.T) {
	root := fakeRoot(t)
	l, err := discover(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.spec()
	if err != nil {
		t.Fatal(err)
	}
	specDir := t.TempDir()
	file := filepath.Join(specDir, "nvidia-gpu.json")
	if err := writeSpec(file, s); err != nil {
		t.Fatal(err)
	}
	if _, err := cdi.ReadSpec(file, 0); err != nil {
		t.Fatalf("the CDI library refuses the spec: %v", err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("spec errors: %v", errs)
	}
	if got, want := cache.ListDevices(), []string{"nvidia.com/gpu=0", "nvidia.com/gpu=all"}; !slices.Equal(got, want) {
		t.Errorf("devices %q, want %q", got, want)
	}

	oci := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	if unresolved, err := cache.InjectDevices(oci, "nvidia.com/gpu=all"); err != nil || len(unresolved) > 0 {
		t.Fatalf("InjectDevices: unresolved %q, %v", unresolved, err)
	}
	var nodes []string
	for _, d := range oci.Linux.Devices {
		nodes = append(nodes, d.Path)
		if d.Type != "c" || d.Major != 1 || d.Minor != 3 {
			t.Errorf("device %s is %s %d:%d, want c 1:3 (the fake's /dev/null)", d.Path, d.Type, d.Major, d.Minor)
		}
	}
	if want := []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"}; !sameSet(nodes, want) {
		t.Errorf("device nodes %q, want %q", nodes, want)
	}
	if oci.Linux.Resources == nil || len(oci.Linux.Resources.Devices) != len(nodes) {
		t.Errorf("device cgroup rules %+v, want one per node", oci.Linux.Resources)
	}

	mounts := map[string]specs.Mount{}
	for _, m := range oci.Mounts {
		if _, dup := mounts[m.Destination]; dup {
			t.Errorf("%s mounted twice", m.Destination)
		}
		mounts[m.Destination] = m
		if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "bind") {
			t.Errorf("%s mounted with %q, want a read-only bind", m.Destination, m.Options)
		}
		if m.Source != filepath.Join(root, m.Destination) {
			t.Errorf("%s mounted from %s, want the same path below %s", m.Destination, m.Source, root)
		}
	}
	for _, p := range []string{
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.999.99",
		"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.999.99",
		"/usr/bin/nvidia-smi",
	} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("%s not mounted; mounts: %v", p, mounts)
		}
	}
	if len(mounts) != 5 {
		t.Errorf("%d mounts, want 5 (the /lib link is the same folder)", len(mounts))
	}
	if want := "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu"; !slices.Contains(oci.Process.Env, want) {
		t.Errorf("environment %q lacks %s", oci.Process.Env, want)
	}

	facts, err := readSpecFacts(file)
	if err != nil {
		t.Fatal(err)
	}
	if facts != (specFacts{kind: "nvidia.com/gpu", gpuNode: "/dev/nvidia0", major: 1, minor: 3, nvidiaSMI: "/usr/bin/nvidia-smi"}) {
		t.Errorf("facts the check takes from the spec: %+v", facts)
	}
}

// TestDiscoverNamesWhatIsMissing: a layout without a part the check needs
// is refused naming it (and what makes the uvm nodes).
func TestDiscoverNamesWhatIsMissing(t *testing.T) {
	for _, c := range []struct{ remove, want string }{
		{"dev/nvidia0", "no GPU device node"},
		{"dev/nvidiactl", "nvidiactl"},
		{"dev/nvidia-uvm", "nvidia-modprobe -u"},
		{"usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.1 not found"},
		{"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.999.99", "libnvidia-ml.so.1 not found"}, // a dangling link
		{"usr/bin/nvidia-smi", "nvidia-smi not found"},
	} {
		t.Run(filepath.Base(c.remove), func(t *testing.T) {
			root := fakeRoot(t)
			if err := os.Remove(filepath.Join(root, c.remove)); err != nil {
				t.Fatal(err)
			}
			_, err := discover(root, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("discover without %s: %v, want an error with %q", c.remove, err, c.want)
			}
		})
	}
}

// TestDiscoverGPUsInOrder: several GPUs become one device each, by their
// number (nvidia10 after nvidia2), and "all" holds them all; nvidia-caps
// and the like are no GPU.
func TestDiscoverGPUsInOrder(t *testing.T) {
	root := fakeRoot(t)
	for _, n := range []string{"nvidia10", "nvidia2", "nvidia-caps"} {
		if err := linkToDevNull(filepath.Join(root, "dev", n), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	l, err := discover(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.spec()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range s.Devices {
		names = append(names, d.Name)
	}
	if want := []string{"0", "2", "10", "all"}; !slices.Equal(names, want) {
		t.Errorf("devices %q, want %q", names, want)
	}
	if n := len(s.Devices[3].ContainerEdits.DeviceNodes); n != 3 {
		t.Errorf("device all has %d nodes, want 3", n)
	}
}

func TestLdconfigDirs(t *testing.T) {
	out := []byte(`1234 libs found in cache ` + "`/etc/ld.so.cache'" + `
	libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
	libcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
	libcuda.so.1 (libc6,x86-64) => /usr/lib64/nvidia/libcuda.so.1
	libcuda.so (libc6,x86-64) => /usr/lib64/nvidia/libcuda.so
	libc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
	libcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
`)
	if got, want := ldconfigDirs(out, "x86-64"), []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64/nvidia"}; !slices.Equal(got, want) {
		t.Errorf("ldconfigDirs = %q, want %q", got, want)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
