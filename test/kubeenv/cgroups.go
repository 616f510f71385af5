package kubeenv

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The file system magics of cgroup v1 and v2 (linux/magic.h); the standard
// library has no names for them.
const (
	cgroupMagic  = 0x27e0eb
	cgroup2Magic = 0x63677270
)

// Cgroups is a kubelet's cgroupRoot, made in every hierarchy of the host.
type Cgroups struct {
	Root        string   // "/berth-<tier>-PID"
	Hierarchies []string // the cgroup mount points it was made in
}

// V2 tells whether the host has the one unified hierarchy.
func (c *Cgroups) V2() bool { return len(c.Hierarchies) == 1 }

// cgroupMounts are the cgroup hierarchies mounted under /sys/fs/cgroup:
// each v1 controller mount (and the hybrid "unified" one), or the one v2 root.
func cgroupMounts(t *testing.T) []string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/cgroup", &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == cgroup2Magic {
		return []string{"/sys/fs/cgroup"}
	}
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ent := range ents {
		dir := filepath.Join("/sys/fs/cgroup", ent.Name())
		if ent.Type()&fs.ModeSymlink != 0 {
			continue
		}
		if syscall.Statfs(dir, &st) == nil && (st.Type == cgroupMagic || st.Type == cgroup2Magic) {
			out = append(out, dir)
		}
	}
	return out
}

// MakeCgroupRoot creates root in every hierarchy: the kubelet refuses a
// cgroupRoot that does not exist.
func MakeCgroupRoot(t *testing.T, root string) *Cgroups {
	t.Helper()
	c := &Cgroups{Root: root, Hierarchies: cgroupMounts(t)}
	for _, h := range c.Hierarchies {
		dir := filepath.Join(h, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			t.Fatal(err)
		}
		// A new v1 cpuset starts empty: no process could join it.
		if _, err := os.Stat(filepath.Join(dir, "cpuset.cpus")); err == nil && !strings.HasSuffix(h, "unified") {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					t.Fatalf("%s/%s: %v", dir, f, err)
				}
			}
		}
	}
	// Ask the v2 root to hand its controllers down when it is the only hierarchy.
	if c.V2() {
		b, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
		for _, ctl := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join("/sys/fs/cgroup", root, "cgroup.subtree_control"), []byte("+"+ctl), 0o644)
		}
	}
	return c
}

// Dirs lists the root and every cgroup below it, in every hierarchy,
// deepest first.
func (c *Cgroups) Dirs() []string {
	var dirs []string
	for _, h := range c.Hierarchies {
		_ = filepath.WalkDir(filepath.Join(h, c.Root), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// Remove removes the root's tree (nothing when c is nil: the run failed
// before making it); a cgroup that still holds a process is a leak: it is
// reported and its processes killed first.
func (c *Cgroups) Remove(t *testing.T) {
	if c == nil {
		return
	}
	for _, dir := range c.Dirs() {
		if procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); len(bytes.TrimSpace(procs)) > 0 {
			t.Errorf("teardown: cgroup %s still holds processes %q (killed)", dir, strings.Fields(string(procs)))
			for _, f := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		for i := 0; i < 50; i++ {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			if i == 49 {
				t.Errorf("teardown: rmdir %s: %v", dir, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// ProcCgroup is the cgroup of pid in the hierarchy of controller (v1), or
// its one v2 cgroup.
func ProcCgroup(t *testing.T, pid int, controller string, v2 bool) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[0] == "0" || !v2 && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2]
		}
	}
	t.Fatalf("process %d has no %s cgroup in %q", pid, controller, b)
	return ""
}

// ExpectFile checks that file of cgroup (in controller's v1 hierarchy, or
// v2 for "") holds want.
func ExpectFile(t *testing.T, controller, cgroup, file, want string) {
	t.Helper()
	p := filepath.Join("/sys/fs/cgroup", controller, cgroup, file)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	if got := strings.TrimSpace(string(b)); got != want {
		t.Errorf("%s = %s, want %s", p, got, want)
	}
}
