package spec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// hostDevDir is where a privileged container's devices come from.
var hostDevDir = "/dev"

func i64(v int64) *int64 { return &v }

// DefaultDeviceRules returns the device cgroup list of a non-privileged
// container (containerd's): deny everything, then allow the standard character
// devices. runc appends its own allow list after it in any case.
func DefaultDeviceRules() []specs.LinuxDeviceCgroup {
	return []specs.LinuxDeviceCgroup{
		{Allow: false, Access: "rwm"},
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"},    // /dev/null
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(8), Access: "rwm"},    // /dev/random
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(7), Access: "rwm"},    // /dev/full
		{Allow: true, Type: "c", Major: i64(5), Minor: i64(0), Access: "rwm"},    // /dev/tty
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(5), Access: "rwm"},    // /dev/zero
		{Allow: true, Type: "c", Major: i64(1), Minor: i64(9), Access: "rwm"},    // /dev/urandom
		{Allow: true, Type: "c", Major: i64(5), Minor: i64(1), Access: "rwm"},    // /dev/console
		{Allow: true, Type: "c", Major: i64(136), Access: "rwm"},                 // /dev/pts/*
		{Allow: true, Type: "c", Major: i64(5), Minor: i64(2), Access: "rwm"},    // /dev/ptmx
		{Allow: true, Type: "c", Major: i64(10), Minor: i64(200), Access: "rwm"}, // /dev/net/tun
	}
}

var errNotDevice = errors.New("not a device node")

// deviceFromPath stats the host node at hostPath (not following a final
// symlink) for its type, numbers, mode and owner.
func deviceFromPath(hostPath, containerPath string) (specs.LinuxDevice, error) {
	var st unix.Stat_t
	if err := unix.Lstat(hostPath, &st); err != nil {
		return specs.LinuxDevice{}, &os.PathError{Op: "stat", Path: hostPath, Err: err}
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	default:
		return specs.LinuxDevice{}, errNotDevice
	}
	rdev := uint64(st.Rdev) //nolint:unconvert // Rdev's type differs between architectures
	mode := os.FileMode(st.Mode & 0o777)
	uid, gid := st.Uid, st.Gid
	return specs.LinuxDevice{
		Path:     containerPath,
		Type:     typ,
		Major:    int64(unix.Major(rdev)),
		Minor:    int64(unix.Minor(rdev)),
		FileMode: &mode,
		UID:      &uid,
		GID:      &gid,
	}, nil
}

// validPermissions checks a CRI device's permissions ("" means "rwm").
func validPermissions(p string) (string, error) {
	if p == "" {
		return "rwm", nil
	}
	for _, r := range p {
		if !strings.ContainsRune("rwm", r) {
			return "", fmt.Errorf("permissions %q: only r, w and m are allowed", p)
		}
	}
	return p, nil
}

// buildDevices returns the container's device nodes and its device cgroup
// rules. Privileged: every host device and a rule allowing all. Otherwise
// DefaultDeviceRules. CRI devices come on top of either: their host path is
// resolved (symlinks followed) and stat'ed; a directory brings every device
// under it, looked up for pod (see resolveHostPath).
func buildDevices(pod string, cri []*runtimeapi.Device, privileged bool) ([]specs.LinuxDevice, []specs.LinuxDeviceCgroup, error) {
	var devs []specs.LinuxDevice
	var rules []specs.LinuxDeviceCgroup
	if privileged {
		host, err := hostDevices(hostDevDir)
		if err != nil {
			return nil, nil, err
		}
		devs = host
		rules = []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}
	} else {
		rules = DefaultDeviceRules()
	}
	for _, d := range cri {
		perms, err := validPermissions(d.GetPermissions())
		if err != nil {
			return nil, nil, fmt.Errorf("device %q: %w", d.GetHostPath(), err)
		}
		found, err := criDevices(pod, d)
		if err != nil {
			return nil, nil, err
		}
		for _, dev := range found {
			devs = replaceDevice(devs, dev)
			rules = append(rules, specs.LinuxDeviceCgroup{
				Allow: true, Type: dev.Type, Major: i64(dev.Major), Minor: i64(dev.Minor), Access: perms,
			})
		}
	}
	return devs, rules, nil
}

func replaceDevice(devs []specs.LinuxDevice, d specs.LinuxDevice) []specs.LinuxDevice {
	for i := range devs {
		if devs[i].Path == d.Path {
			devs[i] = d
			return devs
		}
	}
	return append(devs, d)
}

func criDevices(pod string, d *runtimeapi.Device) ([]specs.LinuxDevice, error) {
	hostPath, ctrPath := d.GetHostPath(), d.GetContainerPath()
	if !filepath.IsAbs(hostPath) {
		return nil, fmt.Errorf("device host_path %q must be an absolute path", hostPath)
	}
	if ctrPath == "" {
		ctrPath = hostPath
	}
	if !path.IsAbs(ctrPath) {
		return nil, fmt.Errorf("device %q: container_path %q must be an absolute path", hostPath, ctrPath)
	}
	ctrPath = path.Clean(ctrPath)
	resolved, fi, err := resolveHostPath(pod, "device host_path", hostPath)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		dev, err := deviceFromPath(resolved, ctrPath)
		if err != nil {
			return nil, fmt.Errorf("device host_path %q: %w", hostPath, err)
		}
		return []specs.LinuxDevice{dev}, nil
	}
	var out []specs.LinuxDevice
	err = filepath.WalkDir(resolved, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(resolved, p)
		dev, err := deviceFromPath(p, path.Join(ctrPath, filepath.ToSlash(rel)))
		if err == nil {
			out = append(out, dev)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("device host_path %q: %w", hostPath, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("device host_path %q: no device nodes in the directory", hostPath)
	}
	return out, nil
}

// hostDevices lists the device nodes under dir for a privileged container,
// skipping what the container gets on its own (pts, shm, mqueue, console)
// and what is not a device.
func hostDevices(dir string) ([]specs.LinuxDevice, error) {
	var out []specs.LinuxDevice
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // a node vanished or is unreadable: skip it
		}
		if e.IsDir() {
			switch e.Name() {
			case "pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev":
				if p != dir {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if e.Name() == "console" {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		dev, err := deviceFromPath(p, path.Join("/dev", filepath.ToSlash(rel)))
		if err == nil {
			out = append(out, dev)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list host devices in %s: %w", dir, err)
	}
	return out, nil
}
