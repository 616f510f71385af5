package podns

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// WithUserNS creates a user namespace with the given mappings (and the other
// namespaces in flags, owned by it), calls f with the PID of a process inside
// them, then ends that process. A multithreaded Go program cannot unshare a
// user namespace itself, so the namespaces come from a child: a copy of this
// binary traced from its start, which stops at its execve and never runs.
// setgroups stays allowed: containers that join set their supplemental
// groups.
func WithUserNS(uids, gids []syscall.SysProcIDMap, flags uintptr, f func(pid int) error) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("podns: user namespace: %w", err)
	}
	proc, err := os.StartProcess(exe, []string{"berth-userns"}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{
			Cloneflags:                 unix.CLONE_NEWUSER | flags,
			UidMappings:                uids,
			GidMappings:                gids,
			GidMappingsEnableSetgroups: true,
			Ptrace:                     true,
			Pdeathsig:                  syscall.SIGKILL,
		},
	})
	if err != nil {
		return fmt.Errorf("podns: create user namespace: %w", err)
	}
	ferr := f(proc.Pid)
	kerr := proc.Kill()
	_, werr := proc.Wait()
	if kerr != nil || werr != nil {
		return errors.Join(ferr, fmt.Errorf("podns: end user namespace process %d: %w", proc.Pid, errors.Join(kerr, werr)))
	}
	return ferr
}

// createWithUserNS makes the pod's user namespace and the other namespaces of
// pins owned by it, all in one child, and pins them from there. Then it sets
// them up from a thread that joins all but the user namespace: berthd keeps
// its capabilities over the pod's namespaces as their owner's ancestor.
func createWithUserNS(opts Options, pins map[Kind]string) error {
	var flags uintptr
	for k := range pins {
		if k != User {
			flags |= uintptr(cloneFlags[k])
		}
	}
	err := WithUserNS(opts.UIDMappings, opts.GIDMappings, flags, func(pid int) error {
		for k, p := range pins {
			src := fmt.Sprintf("/proc/%d/ns/%s", pid, k)
			if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("podns: pin %s: %w", p, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	onThrowawayThread(func() {
		if err := enterPins(pins); err != nil {
			errc <- err
			return
		}
		errc <- configure(opts, pins)
	})
	return <-errc
}

// enterPins switches the calling thread into the pinned namespaces other
// than the user namespace (a thread may not join one of those).
func enterPins(pins map[Kind]string) error {
	for k, p := range pins {
		if k == User {
			continue
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("podns: open %s: %w", p, err)
		}
		err = unix.Setns(fd, cloneFlags[k])
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("podns: enter %s: %w", p, err)
		}
	}
	return nil
}
