package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func TestMountOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting overlayfs needs root")
	}
	dir := t.TempDir()
	low1, low2 := filepath.Join(dir, "l1"), filepath.Join(dir, "l2")
	for _, d := range []string{low1, low2} {
		os.Mkdir(d, 0o755)
	}
	os.WriteFile(filepath.Join(low1, "a"), []byte("bottom"), 0o644)
	os.WriteFile(filepath.Join(low2, "a"), []byte("top"), 0o644)
	os.WriteFile(filepath.Join(low1, "b"), []byte("only-bottom"), 0o644)
	l := Layout{Lowers: []string{low1, low2}, Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Target: filepath.Join(dir, "rootfs")}
	if err := Mount(l); err != nil {
		t.Fatal(err)
	}
	// Volatile: the unmount does not sync the filesystem under Upper
	// (every kernel berth's tests run on has the option, Linux 5.10).
	if opts := mountOptions(t, l.Target); !strings.Contains(opts, "volatile") {
		t.Errorf("overlay options %q lack volatile", opts)
	}
	got, _ := os.ReadFile(filepath.Join(l.Target, "a"))
	if string(got) != "top" {
		t.Errorf("upper snapshot must win: got %q", got)
	}
	if err := os.WriteFile(filepath.Join(l.Target, "new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(l.Upper, "new")); err != nil {
		t.Errorf("write did not land in the upper layer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(low2, "new")); err == nil {
		t.Error("write reached a snapshot")
	}
	if err := Unmount(l); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(l); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), l.Target) {
		t.Error("overlay still mounted")
	}
	for _, d := range []string{l.Target, l.Upper, l.Work} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left behind", d)
		}
	}
}

func TestMountFailureLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting overlayfs needs root")
	}
	dir := t.TempDir()
	l := Layout{Lowers: []string{filepath.Join(dir, "missing")}, Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Target: filepath.Join(dir, "rootfs")}
	if err := Mount(l); err == nil {
		t.Fatal("mount over a missing lower dir succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
	if err := Mount(Layout{}); err == nil {
		t.Error("mount without layers succeeded")
	}
}

// TestMountIDMapped: through idmapped lowers a root-owned image file is the
// container root's; what the container writes is stored with its host IDs.
func TestMountIDMapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting overlayfs needs root")
	}
	dir := t.TempDir()
	low := filepath.Join(dir, "l1")
	os.Mkdir(low, 0o755)
	os.WriteFile(filepath.Join(low, "a"), []byte("image"), 0o644)
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 300000, Size: 65536}}
	err := podns.WithUserNS(m, m, 0, func(pid int) error {
		l := Layout{Lowers: []string{low}, Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Target: filepath.Join(dir, "rootfs"),
			UserNS: fmt.Sprintf("/proc/%d/ns/user", pid), RootUID: 300000, RootGID: 300000}
		if err := Mount(l); err != nil {
			return err
		}
		defer Unmount(l)
		// The idmapped layers were attached only for the overlay mount.
		if _, err := os.Stat(l.Target + ".idmap"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("idmapped layer folder left after the mount: %v", err)
		}
		if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), ".idmap/") {
			t.Errorf("idmapped layer still attached:\n%s", mi)
		}
		for _, name := range []string{"a", "."} {
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(l.Target, name), &st); err != nil || st.Uid != 300000 || st.Gid != 300000 {
				t.Errorf("%s in the rootfs: uid %d gid %d (%v), want 300000", name, st.Uid, st.Gid, err)
			}
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(low, "a"), &st); err != nil || st.Uid != 0 {
			t.Errorf("the image layer changed: uid %d (%v)", st.Uid, err)
		}
		if err := os.WriteFile(filepath.Join(l.Target, "a"), []byte("x"), 0o644); err != nil {
			return err
		}
		if err := syscall.Stat(filepath.Join(l.Upper, "a"), &st); err != nil || st.Uid != 300000 {
			t.Errorf("copied-up file in the upper layer: uid %d (%v), want 300000", st.Uid, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMountIDMappedFUSERefused: a FUSE layer the kernel cannot idmap (Linux
// before 6.12; here a server that does not offer idmapped mounts, which the
// kernel refuses the same way) fails a user-namespaced rootfs with
// FailedPrecondition naming the cause, and leaves nothing behind.
func TestMountIDMappedFUSERefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE and overlayfs needs root")
	}
	dir := t.TempDir()
	low := filepath.Join(dir, "lazy")
	os.Mkdir(low, 0o755)
	root := &fs.Inode{}
	srv, err := fs.Mount(low, root, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMount: true, DirectMountStrict: true, AllowOther: true, Options: []string{"default_permissions"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 300000, Size: 65536}}
	rootDir := filepath.Join(dir, "ctr")
	os.Mkdir(rootDir, 0o755)
	err = podns.WithUserNS(m, m, 0, func(pid int) error {
		userNS := fmt.Sprintf("/proc/%d/ns/user", pid)
		l := Layout{Lowers: []string{low}, Upper: filepath.Join(rootDir, "upper"), Work: filepath.Join(rootDir, "work"), Target: filepath.Join(rootDir, "rootfs"),
			UserNS: userNS, RootUID: 300000, RootGID: 300000}
		err := Mount(l)
		if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "6.12") {
			t.Errorf("rootfs over a FUSE layer that cannot be idmapped: %v, want FailedPrecondition naming Linux 6.12", err)
		}
		err = MountImage([]string{low}, filepath.Join(rootDir, "volume"), userNS)
		if !errors.Is(err, errkind.FailedPrecondition) {
			t.Errorf("image volume of a FUSE layer that cannot be idmapped: %v, want FailedPrecondition", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(rootDir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), rootDir) {
		t.Errorf("mounts left behind:\n%s", mi)
	}
}

// mountOptions are the super block options of the mount on target, from
// /proc/self/mountinfo.
func mountOptions(t *testing.T, target string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == target {
			return f[len(f)-1]
		}
	}
	t.Fatalf("%s is not mounted", target)
	return ""
}
