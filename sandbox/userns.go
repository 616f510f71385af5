package sandbox

import (
	"fmt"
	"os"
	"syscall"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/rootfs"
	"github.com/berth-runtime/berth/sandbox/store"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// usernsField is the CRI field every user-namespace refusal names.
const usernsField = "linux.security_context.namespace_options.userns_options"

// podUserNS returns the pod's own user namespace request, nil for the
// host's, and refuses what berth cannot honour before anything of the pod
// exists. No options, or mode NODE, is the host's user namespace (POD is the
// enum's zero value, so an absent message must not be read as POD). A pod
// of its own (mode POD) must map container ID 0 with exactly one uid and one
// gid range, the shape the kubelet sends, on a kernel that has what it
// needs (f.UserNamespaces).
func podUserNS(cfg *runtimeapi.PodSandboxConfig, f KernelFeatures) (*runtimeapi.UserNamespace, error) {
	o := namespaceOptions(cfg).GetUsernsOptions()
	if o == nil {
		return nil, nil
	}
	switch o.GetMode() {
	case runtimeapi.NamespaceMode_NODE:
		if len(o.GetUids()) != 0 || len(o.GetGids()) != 0 {
			return nil, errkind.Errorf(errkind.Invalid, "%s: mode NODE takes no uids or gids", usernsField)
		}
		return nil, nil
	case runtimeapi.NamespaceMode_POD:
	default:
		return nil, errkind.Errorf(errkind.Invalid, "%s.mode %s: only NODE and POD are supported", usernsField, o.GetMode())
	}
	if err := checkIDMapping(usernsField+".uids", o.GetUids()); err != nil {
		return nil, err
	}
	if err := checkIDMapping(usernsField+".gids", o.GetGids()); err != nil {
		return nil, err
	}
	if !f.UserNamespaces {
		return nil, errkind.Errorf(errkind.FailedPrecondition, "%s.mode POD: this kernel cannot idmap mounts on berth's root folder, which user namespaces need (Status advertises user_namespaces false)", usernsField)
	}
	// The kernel mounts sysfs only for a user namespace that owns the
	// network namespace; on the host's, runc fails every container with
	// EPERM. Refused here, before the pod exists, as Status says.
	if namespaceOptions(cfg).GetNetwork() == runtimeapi.NamespaceMode_NODE {
		return nil, errkind.Errorf(errkind.FailedPrecondition, "%s.mode POD with network NODE: a container on the host's network cannot mount /sys from its own user namespace (Status advertises user_namespaces_host_network false)", usernsField)
	}
	return o, nil
}

// checkIDMapping wants one range that maps container ID 0 to a host range
// that does not wrap around.
func checkIDMapping(field string, m []*runtimeapi.IDMapping) error {
	switch {
	case len(m) != 1:
		return errkind.Errorf(errkind.Invalid, "%s: want exactly one mapping, got %d", field, len(m))
	case m[0].GetContainerId() != 0:
		return errkind.Errorf(errkind.Invalid, "%s: container ID 0 is not mapped (mapping starts at %d)", field, m[0].GetContainerId())
	case m[0].GetLength() == 0:
		return errkind.Errorf(errkind.Invalid, "%s: mapping length is 0", field)
	case uint64(m[0].GetHostId())+uint64(m[0].GetLength()) > 1<<32-1:
		return errkind.Errorf(errkind.Invalid, "%s: host range %d+%d goes past the largest ID", field, m[0].GetHostId(), m[0].GetLength())
	}
	return nil
}

func specIDMap(m *runtimeapi.IDMapping) []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: m.ContainerId, HostID: m.HostId, Size: m.Length}}
}

func sysProcIDMap(m *runtimeapi.IDMapping) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: int(m.ContainerId), HostID: int(m.HostId), Size: int(m.Length)}}
}

// checkContainerUserns refuses a container whose userns_options differ from
// its pod's: it can only run in the pod's user namespace (or the host's).
func checkContainerUserns(pod *store.Pod, cfg *runtimeapi.ContainerConfig) error {
	c := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetUsernsOptions()
	if c == nil {
		return nil
	}
	p := namespaceOptions(pod.Config).GetUsernsOptions()
	if p == nil {
		p = &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE}
	}
	if !proto.Equal(c, p) {
		return errkind.Errorf(errkind.Invalid, "config.linux.security_context.namespace_options.userns_options: %v differs from the pod's %v", c, p)
	}
	return nil
}

// checkIDMappable refuses a container whose idmapped mounts (its CRI mounts,
// in a pod with the user namespace pinned at userNS) are on a filesystem
// that cannot be idmapped on this kernel: a tmpfs before Linux 6.3, a ramfs
// on any. libcontainer would find out only when it makes the container,
// with an error that names no CRI field.
func checkIDMappable(s *specs.Spec, userNS string) error {
	if userNS == "" {
		return nil
	}
	ns, err := os.Open(userNS)
	if err != nil {
		return fmt.Errorf("user namespace: %w", err)
	}
	defer ns.Close()
	for _, m := range s.Mounts {
		if m.UIDMappings == nil {
			continue
		}
		tree, err := rootfs.IDMapTree(m.Source, int(ns.Fd()))
		if err != nil {
			return errkind.Errorf(errkind.FailedPrecondition, "mount %s: host_path %q: cannot idmap it into the pod's user namespace (%v); its filesystem must support idmapped mounts on this kernel",
				m.Destination, m.Source, err)
		}
		unix.Close(tree)
	}
	return nil
}
