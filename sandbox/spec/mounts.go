package spec

import (
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Container paths of the pod files.
const (
	etcHosts    = "/etc/hosts"
	etcResolv   = "/etc/resolv.conf"
	etcHostname = "/etc/hostname"
	devShm      = "/dev/shm"
)

// defaultMounts are the kernel filesystems every container gets, with
// containerd's options. Privileged containers get /sys and /sys/fs/cgroup
// read-write.
func defaultMounts(privileged bool) []specs.Mount {
	ro := []string{"ro"}
	if privileged {
		ro = nil
	}
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: append([]string{"nosuid", "noexec", "nodev"}, ro...)},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: append([]string{"nosuid", "noexec", "nodev", "relatime"}, ro...)},
	}
}

// podMounts are the pod's /dev/shm, /etc/hosts, /etc/resolv.conf and
// /etc/hostname. As in containerd the three /etc files follow the rootfs:
// read-only when it is, read-write otherwise; /dev/shm is always read-write.
// None is idmapped: in a pod with a user namespace of its own, the /etc
// files belong to its root's host IDs, and /dev/shm is world-writable.
func podMounts(in Input, readonlyRootfs bool) []specs.Mount {
	var ms []specs.Mount
	switch {
	case in.ShmPath != "":
		ms = append(ms, bindMount(in.ShmPath, devShm, "rprivate", false))
	case in.HostIPC:
		ms = append(ms, bindMount(devShm, devShm, "rprivate", false))
	default:
		ms = append(ms, specs.Mount{Destination: devShm, Type: "tmpfs", Source: "shm",
			Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}})
	}
	for _, f := range []struct{ src, dst string }{
		{in.HostsPath, etcHosts}, {in.ResolvPath, etcResolv}, {in.HostnamePath, etcHostname},
	} {
		if f.src != "" {
			ms = append(ms, bindMount(f.src, f.dst, "rprivate", readonlyRootfs))
		}
	}
	return ms
}

func bindMount(src, dst, propagation string, readonly bool) specs.Mount {
	rw := "rw"
	if readonly {
		rw = "ro"
	}
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", propagation, rw}}
}

// restrictingMountOptions are the CRI mount_options accepted: the CRI means
// them to narrow a volume (noexec, nodev, nosuid). Anything else ("rw" on a
// read-only mount, "shared", "suid") would loosen what the other fields ask.
var restrictingMountOptions = map[string]bool{
	"ro": true, "noexec": true, "nodev": true, "nosuid": true, "nosymfollow": true,
	"noatime": true, "nodiratime": true, "relatime": true, "strictatime": true,
}

// criMount turns one CRI mount into a bind mount of its (symlink-resolved)
// host path, and returns the rootfs propagation it needs ("" for none).
func criMount(m *runtimeapi.Mount) (specs.Mount, string, error) {
	dst := m.GetContainerPath()
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return specs.Mount{}, "", fmt.Errorf("mount container_path %q: must be an absolute path other than /", dst)
	}
	dst = path.Clean(dst)
	if m.GetImage() != nil && m.GetImage().GetImage() != "" {
		return specs.Mount{}, "", fmt.Errorf("mount %s: image volumes are not supported", dst)
	}
	src := m.GetHostPath()
	if !filepath.IsAbs(src) {
		return specs.Mount{}, "", fmt.Errorf("mount %s: host_path %q must be an absolute path", dst, src)
	}
	resolved, _, err := resolveHostPath("mount "+dst+": host_path", src)
	if err != nil {
		return specs.Mount{}, "", err
	}
	var propagation, rootfs string
	switch m.GetPropagation() {
	case runtimeapi.MountPropagation_PROPAGATION_PRIVATE:
		propagation = "rprivate"
	case runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER:
		propagation, rootfs = "rslave", "rslave"
	case runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL:
		// The host side must be a shared mount for this to work both ways;
		// the caller makes sure of that.
		propagation, rootfs = "rshared", "rshared"
	default:
		return specs.Mount{}, "", fmt.Errorf("mount %s: unknown propagation %v", dst, m.GetPropagation())
	}
	if m.GetRecursiveReadOnly() {
		if !m.GetReadonly() {
			return specs.Mount{}, "", fmt.Errorf("mount %s: recursive_read_only needs readonly", dst)
		}
		if propagation != "rprivate" {
			return specs.Mount{}, "", fmt.Errorf("mount %s: recursive_read_only needs private propagation", dst)
		}
	}
	for _, o := range m.GetMountOptions() {
		if !restrictingMountOptions[o] {
			return specs.Mount{}, "", fmt.Errorf("mount %s: mount_options %q: only options that restrict a bind mount are accepted (%s)",
				dst, o, strings.Join(slices.Sorted(maps.Keys(restrictingMountOptions)), ", "))
		}
	}
	bm := bindMount(resolved, dst, propagation, m.GetReadonly())
	if m.GetRecursiveReadOnly() {
		bm.Options = append(bm.Options, "rro")
	}
	bm.Options = append(bm.Options, m.GetMountOptions()...)
	return bm, rootfs, nil
}

// buildMounts returns the defaults, the pod files and the CRI mounts, a CRI
// mount replacing any default at the same destination (and one at /dev every
// default under /dev), sorted so that a parent mounts before its children.
// The second result is the rootfs propagation the CRI mounts need: "rshared"
// for a bidirectional mount, "rslave" for host-to-container, else "".
func buildMounts(in Input, sc *runtimeapi.LinuxContainerSecurityContext) ([]specs.Mount, string, error) {
	var cri []specs.Mount
	rootfsPropagation := ""
	for _, m := range in.Config.GetMounts() {
		if err := checkMountIDMaps(in, m); err != nil {
			return nil, "", err
		}
		cm, prop, err := criMount(m)
		if err != nil {
			return nil, "", err
		}
		if in.UserNS != "" {
			// Idmapped: host root's files are the container root's, and what
			// it writes is stored as host root's, as the kubelet expects of
			// its volumes. The pod files are not (podMounts): berth owns
			// them, gives them to the pod's root, and keeps them in its state
			// folder, on a tmpfs that Linux before 6.3 cannot idmap.
			cm.UIDMappings, cm.GIDMappings = in.UIDMappings, in.GIDMappings
		}
		if prop == "rshared" || (prop == "rslave" && rootfsPropagation == "") {
			rootfsPropagation = prop
		}
		// A later CRI mount at the same destination wins.
		cri = slices.DeleteFunc(cri, func(x specs.Mount) bool { return x.Destination == cm.Destination })
		cri = append(cri, cm)
	}
	overridden := func(m specs.Mount) bool {
		for _, c := range cri {
			if c.Destination == m.Destination || (c.Destination == "/dev" && strings.HasPrefix(m.Destination, "/dev/")) {
				return true
			}
		}
		return false
	}
	defaults := append(defaultMounts(sc.GetPrivileged()), podMounts(in, sc.GetReadonlyRootfs())...)
	mounts := slices.DeleteFunc(defaults, overridden)
	mounts = append(mounts, cri...)
	slices.SortStableFunc(mounts, func(a, b specs.Mount) int {
		return depth(a.Destination) - depth(b.Destination)
	})
	return mounts, rootfsPropagation, nil
}

func depth(p string) int {
	return strings.Count(path.Clean(p), "/")
}

// checkMountIDMaps accepts a mount's uid_mappings and gid_mappings only as
// the kubelet sends them: those of the pod's user namespace, which every
// CRI mount of such a pod gets anyway (buildMounts).
func checkMountIDMaps(in Input, m *runtimeapi.Mount) error {
	if len(m.GetUidMappings()) == 0 && len(m.GetGidMappings()) == 0 {
		return nil
	}
	if in.UserNS == "" || !sameIDMaps(m.GetUidMappings(), in.UIDMappings) || !sameIDMaps(m.GetGidMappings(), in.GIDMappings) {
		return fmt.Errorf("mount %s: uid_mappings and gid_mappings must be those of the pod's user namespace (%v, %v)",
			m.GetContainerPath(), in.UIDMappings, in.GIDMappings)
	}
	return nil
}

func sameIDMaps(cri []*runtimeapi.IDMapping, oci []specs.LinuxIDMapping) bool {
	return slices.EqualFunc(cri, oci, func(a *runtimeapi.IDMapping, b specs.LinuxIDMapping) bool {
		return a.GetContainerId() == b.ContainerID && a.GetHostId() == b.HostID && a.GetLength() == b.Size
	})
}
