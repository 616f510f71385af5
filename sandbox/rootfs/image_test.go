package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-runtime/berth/sandbox/podns"
)

// TestMountImage: an image volume of one layer (a bind) or two (an
// overlay) shows the top layer's files, refuses writes, is idmapped in a
// user namespace, and leaves nothing after UnmountImage.
func TestMountImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	low1, low2 := filepath.Join(dir, "l1"), filepath.Join(dir, "l2")
	for _, d := range []string{low1, low2} {
		os.Mkdir(d, 0o755)
	}
	os.WriteFile(filepath.Join(low1, "a"), []byte("bottom"), 0o644)
	os.WriteFile(filepath.Join(low2, "a"), []byte("top"), 0o644)
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 300000, Size: 65536}}
	for _, c := range []struct {
		name   string
		lowers []string
		want   string
		userns bool
	}{
		{"one-layer", []string{low1}, "bottom", false},
		{"two-layers", []string{low1, low2}, "top", false},
		{"one-layer-userns", []string{low1}, "bottom", true},
		{"two-layers-userns", []string{low1, low2}, "top", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			target := filepath.Join(dir, "vol-"+c.name)
			check := func(userNS string, wantUID uint32) error {
				if err := MountImage(c.lowers, target, userNS); err != nil {
					return err
				}
				if got, err := os.ReadFile(filepath.Join(target, "a")); string(got) != c.want {
					t.Errorf("a: %q (%v), want %q", got, err, c.want)
				}
				if err := os.WriteFile(filepath.Join(target, "new"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
					t.Errorf("write in the image volume: %v, want EROFS", err)
				}
				var st syscall.Stat_t
				if err := syscall.Stat(filepath.Join(target, "a"), &st); err != nil || st.Uid != wantUID {
					t.Errorf("owner of a: %d (%v), want %d", st.Uid, err, wantUID)
				}
				if err := UnmountImage(target); err != nil {
					return err
				}
				if err := UnmountImage(target); err != nil {
					t.Errorf("second UnmountImage: %v", err)
				}
				for _, p := range []string{target, target + ".idmap"} {
					if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("%s left behind: %v", p, err)
					}
				}
				if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), target) {
					t.Errorf("still mounted:\n%s", mi)
				}
				return nil
			}
			var err error
			if c.userns {
				err = podns.WithUserNS(m, m, 0, func(pid int) error {
					return check(fmt.Sprintf("/proc/%d/ns/user", pid), 300000)
				})
			} else {
				err = check("", 0)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestMountImageFailureLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	for _, lowers := range [][]string{{filepath.Join(dir, "missing")}, {filepath.Join(dir, "missing"), filepath.Join(dir, "gone")}, nil} {
		if err := MountImage(lowers, filepath.Join(dir, "vol"), ""); err == nil {
			t.Fatalf("image volume of %v mounted", lowers)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("left behind: %v", entries)
		}
	}
}
