package sandbox

import (
	"errors"

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
}

// probeKernelFeatures asks the kernel. mount_setattr on a bad descriptor
// fails with EBADF where it exists, ENOSYS where it does not (and EPERM under
// a seccomp filter that hides it).
func probeKernelFeatures() KernelFeatures {
	err := unix.MountSetattr(-1, "", unix.AT_EMPTY_PATH, &unix.MountAttr{})
	return KernelFeatures{
		RecursiveReadOnlyMounts: !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM),
	}
}

// Features reports what this kernel lets berth honour.
func (m *Manager) Features() KernelFeatures { return m.features }

// checkFeatures refuses a container config that needs a kernel feature this
// host lacks.
func (m *Manager) checkFeatures(cfg *runtimeapi.ContainerConfig) error {
	for _, mnt := range cfg.GetMounts() {
		if mnt.GetRecursiveReadOnly() && !m.features.RecursiveReadOnlyMounts {
			return wrapf(ErrInvalid, "mount %s: recursive_read_only needs mount_setattr (Linux 5.12 or later), which this kernel lacks",
				mnt.GetContainerPath())
		}
	}
	return nil
}
