package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// defaultRoot is where the cgroup hierarchies are mounted on every distribution
// berth supports; tests use a temp dir instead (see newManager).
const defaultRoot = "/sys/fs/cgroup"

// Mode is the cgroup layout of the host.
type Mode int

const (
	// V1 is legacy or hybrid mode: one hierarchy per controller (or group of
	// controllers) under /sys/fs/cgroup, possibly plus a controller-less
	// cgroup2 mount at /sys/fs/cgroup/unified.
	V1 Mode = iota + 1
	// V2 is unified mode: a single cgroup2 hierarchy at /sys/fs/cgroup.
	V2
)

func (m Mode) String() string {
	switch m {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// DetectMode reports the host's cgroup mode from the filesystem type of
// /sys/fs/cgroup: cgroup2 there means unified, anything else (a tmpfs holding
// per-controller mounts) means legacy or hybrid. New makes the same check
// and also refuses a host without cgroups.
func DetectMode() Mode {
	m, err := detectMode(defaultRoot)
	if err != nil {
		return V1
	}
	return m
}

func detectMode(root string) (Mode, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: root, Err: err}
	}
	switch st.Type {
	case unix.CGROUP2_SUPER_MAGIC:
		return V2, nil
	case unix.TMPFS_MAGIC, unix.CGROUP_SUPER_MAGIC:
		return V1, nil
	}
	return 0, fmt.Errorf("%s is neither cgroup2 nor a tmpfs of cgroup v1 mounts (fs type %#x)", root, st.Type)
}

// v1Hierarchies maps each v1 subsystem mounted under root to its mount dir.
// Keys are the names libcontainer's fs manager uses: "cpu", "memory", ...,
// "name=systemd" for systemd's named hierarchy and "" for the hybrid cgroup2
// mount ("unified"). Co-mounted controllers ("cpu,cpuacct") share a dir; the
// convenience symlinks ("cpu" -> "cpu,cpuacct") are skipped.
//
// Mounts are found by name rather than from mountinfo so that a fake tree in
// a temp dir works the same; on the real root each one must be a cgroup mount.
func v1Hierarchies(root string) (map[string]string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	h := map[string]string{}
	for _, e := range ents {
		if !e.IsDir() { // also skips symlinks
			continue
		}
		dir := filepath.Join(root, e.Name())
		if root == defaultRoot {
			var st unix.Statfs_t
			if unix.Statfs(dir, &st) != nil || (st.Type != unix.CGROUP_SUPER_MAGIC && st.Type != unix.CGROUP2_SUPER_MAGIC) {
				continue
			}
		}
		switch e.Name() {
		case "unified":
			h[""] = dir
		case "systemd":
			h["name=systemd"] = dir
		default:
			for _, c := range strings.Split(e.Name(), ",") {
				h[c] = dir
			}
		}
	}
	if len(h) == 0 {
		return nil, errors.New("no cgroup v1 hierarchy mounted under " + root)
	}
	return h, nil
}

// hostCaps are the optional kernel features that decide whether a CRI field
// can be honoured at all on this host.
type hostCaps struct {
	swap    bool // memory+swap accounting (memory.memsw.* / memory.swap.max)
	hugetlb bool // the hugetlb controller is usable
}

func detectCaps(root string, mode Mode, hier map[string]string) hostCaps {
	var c hostCaps
	if mode == V1 {
		if mem, ok := hier["memory"]; ok {
			c.swap = exists(filepath.Join(mem, "memory.memsw.limit_in_bytes"))
		}
		_, c.hugetlb = hier["hugetlb"]
		return c
	}
	ctrls, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	c.hugetlb = slices.Contains(strings.Fields(string(ctrls)), "hugetlb")
	c.swap = v2SwapAccounting(root)
	return c
}

// v2SwapAccounting looks for memory.swap.max, which the root cgroup never
// has: in the first child of root with the memory controller, or when there
// is none yet, in a short-lived probe cgroup.
func v2SwapAccounting(root string) bool {
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.IsDir() && exists(filepath.Join(root, e.Name(), "memory.max")) {
			return exists(filepath.Join(root, e.Name(), "memory.swap.max"))
		}
	}
	sub, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
	if !slices.Contains(strings.Fields(string(sub)), "memory") {
		return false
	}
	probe := filepath.Join(root, fmt.Sprintf("berth-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return false
	}
	defer os.Remove(probe)
	return exists(filepath.Join(probe, "memory.swap.max"))
}

// defaultCaps are the real host's, for SpecResources which has no Manager.
var defaultCaps = sync.OnceValue(func() hostCaps {
	mode, err := detectMode(defaultRoot)
	if err != nil {
		return hostCaps{}
	}
	var hier map[string]string
	if mode == V1 {
		hier, _ = v1Hierarchies(defaultRoot)
	}
	return detectCaps(defaultRoot, mode, hier)
})

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
