package podns

import (
	"errors"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/sysctl"
	"golang.org/x/sys/unix"
)

// sysctlPath is sysctl.Path with the error the pod's caller gets.
func sysctlPath(key string) (string, error) {
	p, err := sysctl.Path(key)
	if err != nil {
		return "", errkind.Errorf(errkind.Invalid, "podns: sysctl %q: %w", key, err)
	}
	return p, nil
}

// sysctlKind says which namespace holds the sysctl key: only these are
// safe to set per pod, the rest would change the whole node.
func sysctlKind(key string) (Kind, error) {
	if _, err := sysctlPath(key); err != nil {
		return "", err
	}
	d := sysctl.Dotted(key)
	switch sysctl.NamespaceOf(d) {
	case sysctl.Net:
		return Net, nil
	case sysctl.IPC:
		return IPC, nil
	case sysctl.UTS:
		if d == "kernel.hostname" {
			return "", errkind.Errorf(errkind.Invalid, "podns: sysctl %q: set Options.Hostname instead", key)
		}
		return UTS, nil
	}
	return "", errkind.Errorf(errkind.Invalid, "podns: sysctl %q is not namespaced, or not one a container may set", key)
}

// writeSysctl must run on the thread inside the pod's namespaces: files
// under /proc/sys resolve net and ipc entries against the calling thread
// (unlike /proc/net, which follows the thread group leader).
func writeSysctl(key, value string) error {
	p, err := sysctlPath(key)
	if err != nil {
		return err
	}
	// Raw syscalls keep the open and write on this locked thread.
	// The key and value are the caller's: the kernel refusing either (no
	// such key, a value it does not take) is the caller's error.
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errkind.Errorf(errkind.Invalid, "podns: sysctl %q: %w", key, err)
	}
	defer unix.Close(fd)
	n, err := unix.Write(fd, []byte(value))
	if err == nil && n != len(value) {
		err = errors.New("short write")
	}
	if err != nil {
		return errkind.Errorf(errkind.Invalid, "podns: sysctl %q=%q: %w", key, value, err)
	}
	return nil
}
