package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/rootfs"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// KernelFeatures are the optional kernel features that CRI fields need,
// probed once when the manager starts. A field whose feature is missing is
// refused, never ignored.
type KernelFeatures struct {
	// RecursiveReadOnlyMounts: mount_setattr (Linux 5.12), which makes a
	// bind mount and all its submounts read-only.
	RecursiveReadOnlyMounts bool
	// UserNamespaces: idmapped mounts (Linux 5.12) on the filesystem of
	// berth's root folder, where the image layers and pod files are, and
	// overlayfs over idmapped layers (5.19).
	UserNamespaces bool
	// SELinux: the host enforces or audits SELinux labels. berth does not
	// label containers, so where SELinux is on a request for labels is
	// refused rather than run unlabelled; where it is off labels have no
	// effect, as with containerd and CRI-O.
	SELinux bool
}

// probeKernelFeatures asks the kernel. mount_setattr on a bad descriptor
// fails with EBADF where it exists, ENOSYS where it does not (and EPERM under
// a seccomp filter that hides it).
func probeKernelFeatures(root string, log *slog.Logger) KernelFeatures {
	err := unix.MountSetattr(-1, "", unix.AT_EMPTY_PATH, &unix.MountAttr{})
	f := KernelFeatures{RecursiveReadOnlyMounts: !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM),
		SELinux: selinuxEnabled()}
	if f.RecursiveReadOnlyMounts {
		if err := probeIDMappedOverlay(root); err != nil {
			log.Info("user namespaces not supported", "err", err)
		} else {
			f.UserNamespaces = true
		}
	}
	return f
}

// probeIDMappedOverlay mounts an overlay over an idmapped folder of root, as
// a container in a user namespace gets, in a scratch folder it then removes.
func probeIDMappedOverlay(root string) error {
	dir, err := os.MkdirTemp(root, "userns-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lower := filepath.Join(dir, "lower")
	if err := os.Mkdir(lower, 0o755); err != nil {
		return err
	}
	l := rootfs.Layout{Lowers: []string{lower}, Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"),
		Target: filepath.Join(dir, "merged"), RootUID: 65534, RootGID: 65534}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}}
	return podns.WithUserNS(m, m, 0, func(pid int) error {
		l.UserNS = fmt.Sprintf("/proc/%d/ns/user", pid)
		if err := rootfs.Mount(l); err != nil {
			return err
		}
		return rootfs.Unmount(l)
	})
}

// selinuxEnabled: selinuxfs has an enforce file wherever SELinux is on,
// enforcing or permissive.
func selinuxEnabled() bool {
	_, err := os.Stat("/sys/fs/selinux/enforce")
	return err == nil
}

// Features reports what this kernel lets berth honour.
func (m *Manager) Features() KernelFeatures { return m.features }

// checkFeatures refuses a container config that needs a kernel feature this
// host lacks.
func (m *Manager) checkFeatures(cfg *runtimeapi.ContainerConfig) error {
	for _, mnt := range cfg.GetMounts() {
		if mnt.GetRecursiveReadOnly() && !m.features.RecursiveReadOnlyMounts {
			return errkind.Errorf(errkind.Invalid, "mount %s: recursive_read_only needs mount_setattr (Linux 5.12 or later), which this kernel lacks",
				mnt.GetContainerPath())
		}
		if mnt.GetSelinuxRelabel() && m.features.SELinux {
			return errkind.Errorf(errkind.FailedPrecondition, "mount %s: selinux_relabel: %s", mnt.GetContainerPath(), selinuxRefusal)
		}
	}
	return m.checkSELinuxOptions("linux.security_context.selinux_options", cfg.GetLinux().GetSecurityContext().GetSelinuxOptions())
}

// selinuxRefusal says why SELinux fields are refused on an SELinux host.
const selinuxRefusal = "berth does not label containers, and SELinux is enabled on this host"

// checkPodFeatures refuses a pod config that needs a feature this host lacks.
func (m *Manager) checkPodFeatures(cfg *runtimeapi.PodSandboxConfig) error {
	return m.checkSELinuxOptions("linux.security_context.selinux_options", cfg.GetLinux().GetSecurityContext().GetSelinuxOptions())
}

// checkSELinuxOptions refuses labels berth would not apply on a host whose
// SELinux would expect them; an all-empty option asks for nothing.
func (m *Manager) checkSELinuxOptions(field string, o *runtimeapi.SELinuxOption) error {
	if !m.features.SELinux || o.GetUser()+o.GetRole()+o.GetType()+o.GetLevel() == "" {
		return nil
	}
	return errkind.Errorf(errkind.FailedPrecondition, "%s: %s", field, selinuxRefusal)
}
