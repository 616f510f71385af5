package spec

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
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
// host path, or of the image volume the sandbox mounted for it at
// imageRoot, and returns the rootfs propagation it needs ("" for none). A
// host path is looked up for pod (see resolveHostPath).
func criMount(pod string, m *runtimeapi.Mount, imageRoot string) (specs.Mount, string, error) {
	dst := m.GetContainerPath()
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return specs.Mount{}, "", fmt.Errorf("mount container_path %q: must be an absolute path other than /", dst)
	}
	dst = path.Clean(dst)
	resolved, readonly, err := mountSource(pod, dst, m, imageRoot)
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
		if !readonly {
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
	bm := bindMount(resolved, dst, propagation, readonly)
	if m.GetRecursiveReadOnly() {
		bm.Options = append(bm.Options, "rro")
	}
	bm.Options = append(bm.Options, m.GetMountOptions()...)
	return bm, rootfs, nil
}

// mountSource is the host path a CRI mount binds, and whether the mount is
// read-only: an image volume always is, whatever readonly says (the CRI
// defines image mounts as read-only).
func mountSource(pod, dst string, m *runtimeapi.Mount, imageRoot string) (string, bool, error) {
	if m.GetImage().GetImage() == "" {
		if m.GetImageSubPath() != "" {
			return "", false, fmt.Errorf("mount %s: image_sub_path %q needs an image", dst, m.GetImageSubPath())
		}
		src := m.GetHostPath()
		if !filepath.IsAbs(src) {
			return "", false, fmt.Errorf("mount %s: host_path %q must be an absolute path", dst, src)
		}
		resolved, _, err := resolveHostPath(pod, "mount "+dst+": host_path", src)
		return resolved, m.GetReadonly(), err
	}
	if m.GetHostPath() != "" {
		return "", false, fmt.Errorf("mount %s: host_path %q and image %q: a mount has one or the other", dst, m.GetHostPath(), m.GetImage().GetImage())
	}
	if imageRoot == "" {
		return "", false, fmt.Errorf("mount %s: image %q is not mounted", dst, m.GetImage().GetImage())
	}
	src, err := imageSubPath(imageRoot, m.GetImageSubPath())
	if err != nil {
		return "", false, fmt.Errorf("mount %s: image %q: image_sub_path %q: %w", dst, m.GetImage().GetImage(), m.GetImageSubPath(), err)
	}
	return src, true, nil
}

// imageSubPath is the host path of sub inside the image volume mounted at
// root ("" for root itself). sub is resolved as the container would see it
// were the image its root, as the image's /etc/passwd is (RESOLVE_IN_ROOT):
// an absolute symlink starts at the image's root and ".." stops there, so no
// symlink in the image leads out of it. A sub-path that climbs with ".."
// itself or is absolute is refused rather than clamped: it would mount
// another folder than the one asked for (the Kubernetes API refuses both).
func imageSubPath(root, sub string) (string, error) {
	if sub == "" {
		return root, nil
	}
	if path.IsAbs(sub) || slices.Contains(strings.Split(sub, "/"), "..") {
		return "", errors.New(`must be a relative path without ".." that stays inside the image`)
	}
	f, err := openInRoot(root, sub, unix.O_PATH|unix.O_CLOEXEC)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return "", errors.New("not found in the image")
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	// The path the kernel resolved, not a second lexical walk. The image
	// volume is read-only, so it names the same file when the container
	// is made.
	resolved, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return "", err
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	if resolved != realRoot && !strings.HasPrefix(resolved, realRoot+"/") {
		return "", fmt.Errorf("resolved to %s, outside the image", resolved)
	}
	return resolved, nil
}

// buildMounts returns the defaults, the pod files and the CRI mounts, a CRI
// mount replacing any default at the same destination (and one at /dev every
// default under /dev), sorted so that a parent mounts before its children.
// The second result is the rootfs propagation the CRI mounts need: "rshared"
// for a bidirectional mount, "rslave" for host-to-container, else "".
func buildMounts(in Input, sc *runtimeapi.LinuxContainerSecurityContext) ([]specs.Mount, string, error) {
	var cri []specs.Mount
	rootfsPropagation := ""
	for i, m := range in.Config.GetMounts() {
		if err := checkMountIDMaps(in, m); err != nil {
			return nil, "", err
		}
		cm, prop, err := criMount(in.PodID, m, in.ImageVolumes[i])
		if err != nil {
			return nil, "", err
		}
		// An image volume's layers are idmapped where the sandbox mounted
		// them (rootfs.MountImage), as the rootfs's are: overlayfs cannot
		// be idmapped a second time.
		if in.UserNS != "" && m.GetImage().GetImage() == "" {
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
