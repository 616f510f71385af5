package podns

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// DoInNetNS runs f on a locked thread switched into the network namespace
// pinned at pin, then switches that thread back. Only f's own thread is in
// the namespace: goroutines that f starts are not. Sockets f opens stay in
// the pod's namespace after it returns.
func DoInNetNS(pin string, f func() error) error {
	target, err := unix.Open(pin, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("podns: open %s: %w", pin, err)
	}
	defer unix.Close(target)
	errc := make(chan error, 1)
	go func() { errc <- doIn(target, f) }()
	return <-errc
}

func doIn(target int, f func() error) error {
	runtime.LockOSThread()
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("podns: open own netns: %w", err)
	}
	defer unix.Close(self)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("podns: enter netns: %w", err)
	}
	ferr := f()
	if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
		// Stay locked: the goroutine ends and the runtime discards the
		// thread rather than reuse one stuck in the pod's namespace.
		return errors.Join(ferr, fmt.Errorf("podns: restore netns: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}
