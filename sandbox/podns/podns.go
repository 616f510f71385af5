// Package podns creates a pod's network, IPC and UTS namespaces and pins them
// as files (bind mounts of nsfs), so no process has to hold them: containers
// join the pins, and removing the pins frees the namespaces.
package podns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/berth-runtime/berth/cri/errkind"
	"golang.org/x/sys/unix"
)

// Kind names a namespace the way /proc/<pid>/ns does.
type Kind string

// The namespaces a pod owns; its PID namespace (when not the host's) is
// created by the built-in pause process as its PID 1 and then pinned with
// PinProcess, and mount namespaces are the containers' own.
const (
	Net Kind = "net"
	IPC Kind = "ipc"
	UTS Kind = "uts"
	PID Kind = "pid"
	// User is created only with mappings (Options.UIDMappings); the other
	// kinds created with it are owned by it.
	User Kind = "user"
)

var cloneFlags = map[Kind]int{
	Net:  unix.CLONE_NEWNET,
	IPC:  unix.CLONE_NEWIPC,
	UTS:  unix.CLONE_NEWUTS,
	User: unix.CLONE_NEWUSER,
}

// Options says which namespaces to create for a pod and how to set them up.
type Options struct {
	// Dir holds the pins, as Dir/<kind>. Put it under a root prepared with
	// PrepareRoot.
	Dir string
	// Kinds are the namespaces to create; a host-namespace pod omits some.
	Kinds []Kind
	// Hostname is set in the new UTS namespace; ignored without one.
	Hostname string
	// Sysctls are written inside the new namespaces. A key may use dots
	// (with "/" for a literal dot, as the kubelet sends them) or slashes.
	// A key that is not namespaced, or whose namespace is not created, is
	// an error naming the key.
	Sysctls map[string]string
	// UIDMappings and GIDMappings map the user namespace's IDs to the
	// host's; required with User in Kinds, and only then.
	UIDMappings, GIDMappings []syscall.SysProcIDMap
}

// Create makes the namespaces in opts.Kinds, pins them, brings lo up in the
// network namespace and applies the hostname and sysctls. It returns the pin
// path of each kind. On failure it leaves no pin file and no mount behind.
func Create(opts Options) (map[Kind]string, error) {
	if err := validate(opts); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	pins := make(map[Kind]string, len(opts.Kinds))
	for _, k := range opts.Kinds {
		pins[k] = filepath.Join(dir, string(k))
	}
	if len(pins) == 0 {
		return pins, nil
	}
	// Only files made here are ever cleaned up: an existing one may be
	// another pod's live pin.
	made := map[Kind]string{}
	for k, p := range pins {
		f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("podns: create pin: %w", err), removePins(made))
		}
		f.Close()
		made[k] = p
	}
	setup := setupOnThread
	if _, ok := pins[User]; ok {
		setup = createWithUserNS
	}
	if err := setup(opts, pins); err != nil {
		return nil, errors.Join(err, removePins(pins))
	}
	return pins, nil
}

func validate(opts Options) error {
	if opts.Dir == "" {
		return errors.New("podns: Dir is empty")
	}
	have := map[Kind]bool{}
	for _, k := range opts.Kinds {
		if _, ok := cloneFlags[k]; !ok {
			return fmt.Errorf("podns: unknown namespace kind %q", k)
		}
		if have[k] {
			return fmt.Errorf("podns: namespace kind %q given twice", k)
		}
		have[k] = true
	}
	if have[User] != (len(opts.UIDMappings) > 0 && len(opts.GIDMappings) > 0) {
		return errors.New("podns: a user namespace needs uid and gid mappings, and mappings need a user namespace")
	}
	// HOST_NAME_MAX; sethostname would fail later with a vaguer EINVAL.
	if len(opts.Hostname) > 64 {
		return errkind.Errorf(errkind.Invalid, "podns: hostname %q is longer than 64 bytes", opts.Hostname)
	}
	for key := range opts.Sysctls {
		kind, err := sysctlKind(key)
		if err != nil {
			return err
		}
		if !have[kind] {
			return errkind.Errorf(errkind.Invalid, "podns: sysctl %q needs the pod's own %s namespace, which is not created (host namespace?)", key, kind)
		}
	}
	return nil
}

// PinProcess pins the namespace of kind k that process pid is in, as
// dir/<kind>, and returns the pin's path. Containers then join the pin, not
// /proc/<pid>/ns/<kind>: once pid is gone that path fails, or after PID
// reuse names another process's namespace. On failure no pin is left.
func PinProcess(dir string, k Kind, pid int) (string, error) {
	p := filepath.Join(dir, string(k))
	return p, PinProcessAt(p, k, pid)
}

// PinProcessAt is PinProcess with the pin at path p.
func PinProcessAt(p string, k Kind, pid int) error {
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("podns: create pin: %w", err)
	}
	f.Close()
	src := fmt.Sprintf("/proc/%d/ns/%s", pid, k)
	if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
		return errors.Join(fmt.Errorf("podns: pin %s of process %d: %w", k, pid, err), os.Remove(p))
	}
	return nil
}

// Remove unmounts and deletes every pin in dir. A missing pin is not an
// error, so Remove is safe to repeat and to run on a half-made pod.
func Remove(dir string) error {
	pins := map[Kind]string{PID: filepath.Join(dir, string(PID))}
	for k := range cloneFlags {
		pins[k] = filepath.Join(dir, string(k))
	}
	return removePins(pins)
}

func removePins(pins map[Kind]string) error {
	var errs []error
	for _, p := range pins {
		errs = append(errs, RemovePin(p))
	}
	return errors.Join(errs...)
}

// RemovePin unmounts and deletes the pin at p; a missing one is not an
// error.
func RemovePin(p string) error {
	if err := unmountAll(p); err != nil {
		return err
	}
	// Unlinking also detaches copies of the pin that other mount
	// namespaces made, so none of them keeps the namespace alive.
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// unmountAll peels every mount stacked on p (a retried Create could stack
// several); MNT_DETACH because a process may still have the pin open.
func unmountAll(p string) error {
	for range 16 {
		err := unix.Unmount(p, unix.MNT_DETACH)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point, or no file
		default:
			return fmt.Errorf("podns: unmount %s: %w", p, err)
		}
	}
	return fmt.Errorf("podns: unmount %s: still mounted after 16 unmounts", p)
}
