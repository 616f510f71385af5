package cluster

import (
	"bufio"
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

	"golang.org/x/sys/unix"
)

// ---- cgroups ----

// cgroupMounts are the cgroup hierarchies mounted under /sys/fs/cgroup:
// each v1 controller mount (and the hybrid "unified" one), or the one v2 root.
func cgroupMounts(t *testing.T) []string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
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
		if unix.Statfs(dir, &st) == nil && (st.Type == unix.CGROUP_SUPER_MAGIC || st.Type == unix.CGROUP2_SUPER_MAGIC) {
			out = append(out, dir)
		}
	}
	return out
}

// makeCgroupRoot creates the kubelet's cgroupRoot in every hierarchy: the
// kubelet refuses a cgroupRoot that does not exist.
func (e *env) makeCgroupRoot() {
	t := e.t
	t.Helper()
	e.hierarchies = cgroupMounts(t)
	for _, h := range e.hierarchies {
		dir := filepath.Join(h, e.cgroupRoot)
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
	if len(e.hierarchies) == 1 {
		b, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
		want := strings.Fields(string(b))
		for _, c := range want {
			_ = os.WriteFile(filepath.Join("/sys/fs/cgroup", e.cgroupRoot, "cgroup.subtree_control"), []byte("+"+c), 0o644)
		}
	}
}

// cgroupDirs lists the run's cgroupRoot and every cgroup below it, in every
// hierarchy, deepest first.
func (e *env) cgroupDirs() []string {
	var dirs []string
	for _, h := range e.hierarchies {
		_ = filepath.WalkDir(filepath.Join(h, e.cgroupRoot), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// removeCgroups removes the cgroupRoot tree; a cgroup that still holds a
// process is a leak: it is reported and its processes killed first.
func (e *env) removeCgroups() {
	t := e.t
	for _, dir := range e.cgroupDirs() {
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

// ---- mounts and folders ----

// mountsUnder lists mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mp := unescapeMount(fields[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return slices.Compact(out)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (e *env) removeWork() {
	t := e.t
	for _, m := range mountsUnder(e.work) {
		// Two folders are bind mounts of themselves by design: the kubelet's
		// root dir (made rshared) and berth's pod pin folder (made rprivate).
		if m != e.kubeletRoot && m != filepath.Join(e.state, "pods") {
			t.Errorf("teardown: %s is still mounted (unmounted now)", m)
		}
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("teardown: unmount %s: %v", m, err)
		}
	}
	// BERTH_CLUSTER_LOGS names a folder that gets the logs of every run
	// (CI artifacts); without it they are kept only when the test failed.
	keep := os.Getenv("BERTH_CLUSTER_LOGS")
	if keep == "" && t.Failed() {
		keep = filepath.Join(os.TempDir(), "berth-cluster-logs-"+time.Now().Format("20060102-150405"))
	}
	if keep != "" {
		if os.MkdirAll(keep, 0o755) == nil {
			for _, f := range []string{"berthd.log", "kubelet.log", "kube-proxy.log", "kube-apiserver.log",
				"kube-controller-manager.log", "kube-scheduler.log", "etcd.log"} {
				if b, err := os.ReadFile(e.path(f)); err == nil {
					_ = os.WriteFile(filepath.Join(keep, f), b, 0o644)
				}
			}
			t.Logf("full logs kept in %s", keep)
		}
	}
	if err := os.RemoveAll(e.work); err != nil {
		t.Errorf("teardown: remove %s: %v", e.work, err)
	}
}

// processesWithArg returns live processes with an argument containing substr.
func processesWithArg(substr string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(substr)) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if i := bytes.LastIndexByte(stat, ')'); err != nil || i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		if pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}
