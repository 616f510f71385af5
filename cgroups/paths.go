package cgroups

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/cgroups/systemd"
)

// Driver is the cgroup driver the kubelet and berth agree on.
type Driver string

const (
	Cgroupfs Driver = "cgroupfs"
	Systemd  Driver = "systemd"
)

// scopePrefix names container scopes "berth-<id>.scope" under the systemd driver.
const scopePrefix = "berth"

// PodCgroup returns the pod's cgroup. The kubelet's cgroup_parent already
// names the pod's own cgroup ("/kubepods/burstable/pod<uid>" for cgroupfs,
// "kubepods-burstable-pod<uid>.slice" for systemd), so it is used as given.
// A kubelet on the systemd driver sends the slice's expanded path,
// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice"
// (its CgroupName.ToSystemd): that is the slice named by its last element,
// which is what containerd and CRI-O take too (critest's "/test.slice" is
// the same form). Without one (crictl) the pod goes under berth's own
// parent: "/berth/pod<uid>" or "berth-pod<uid>.slice".
func (m *Manager) PodCgroup(cgroupParent, podUID string) string {
	uid := sanitize(podUID)
	if m.driver == Systemd {
		if strings.Contains(cgroupParent, "/") {
			// Only the expansion of its own last element: any other
			// path stays as given, and is refused as a slice name.
			slice := path.Base(cgroupParent)
			if dir, err := systemd.ExpandSlice(slice); err == nil && dir == path.Clean("/"+cgroupParent) {
				return slice
			}
		}
		if cgroupParent != "" {
			return cgroupParent
		}
		// "-" separates slice levels in systemd, so it cannot appear in a name.
		return "berth-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	}
	if cgroupParent != "" {
		return path.Clean("/" + cgroupParent)
	}
	return "/berth/pod" + uid
}

// ContainerCgroupsPath returns the OCI linux.cgroupsPath of a container of
// the pod: a child directory for cgroupfs, runc's "slice:prefix:name" form
// for systemd (scope "berth-<id>.scope" in the pod's slice).
func (m *Manager) ContainerCgroupsPath(podCgroup, containerID string) string {
	id := sanitize(containerID)
	if m.driver == Systemd {
		return podCgroup + ":" + scopePrefix + ":" + id
	}
	return path.Join(podCgroup, id)
}

// sanitize keeps IDs from adding path levels or systemd separators of their own.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// fsPath turns a cgroup path as this package hands it out (a cgroupfs path,
// a systemd slice, or runc's "slice:prefix:name") into the path of the cgroup
// below a hierarchy's mount point. Everything that touches files goes through
// here, so the systemd naming rules live in one place.
func (m *Manager) fsPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty cgroup path")
	}
	if m.driver != Systemd {
		return path.Clean("/" + p), nil
	}
	return systemdFSPath(p)
}

// systemdFSPath follows runc: a slice "a-b.slice" lives at
// /a.slice/a-b.slice; "slice:prefix:name" is the unit prefix-name.scope (or
// name itself when it is a slice) inside the slice, system.slice by default.
func systemdFSPath(p string) (string, error) {
	parts := strings.Split(p, ":")
	switch len(parts) {
	case 1:
		dir, err := systemd.ExpandSlice(p)
		if err != nil {
			return "", fmt.Errorf("systemd cgroup %q: %w", p, err)
		}
		return dir, nil
	case 3:
		slice, prefix, name := parts[0], parts[1], parts[2]
		if slice == "" {
			slice = "system.slice"
		}
		if name == "" || strings.Contains(name, "/") {
			return "", fmt.Errorf("systemd cgroup %q: bad unit name", p)
		}
		dir, err := systemd.ExpandSlice(slice)
		if err != nil {
			return "", fmt.Errorf("systemd cgroup %q: %w", p, err)
		}
		unit := name
		if !strings.HasSuffix(name, ".slice") {
			unit = prefix + "-" + name + ".scope"
		}
		return path.Join(dir, unit), nil
	}
	return "", fmt.Errorf("systemd cgroup %q: want a slice name or slice:prefix:name", p)
}

// parentSlice is the slice systemd nests a slice in: "a-b-c.slice" is in
// "a-b.slice", a top-level slice in the root slice "-.slice".
func parentSlice(slice string) string {
	name := strings.TrimSuffix(slice, ".slice")
	if i := strings.LastIndex(name, "-"); i > 0 {
		return name[:i] + ".slice"
	}
	return "-.slice"
}

// dirs returns the cgroup's directory in every hierarchy: one per distinct
// v1 mount (co-mounted controllers once), or the single v2 one.
func (m *Manager) dirs(rel string) []string {
	if m.mode == V2 {
		return []string{filepath.Join(m.root, rel)}
	}
	seen := map[string]bool{}
	var out []string
	for _, mnt := range m.hier {
		if !seen[mnt] {
			seen[mnt] = true
			out = append(out, filepath.Join(mnt, rel))
		}
	}
	slices.Sort(out) // stable order for errors and tests
	return out
}
