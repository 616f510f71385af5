package podns

import (
	"fmt"
	"maps"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"
)

// setupOnThread creates the namespaces on a thread of their own and pins
// them. The thread is never handed back to the Go scheduler: its goroutine
// exits still locked, and the runtime then ends the thread, so no other
// goroutine ever runs inside the pod's namespaces.
func setupOnThread(opts Options, pins map[Kind]string) error {
	errc := make(chan error, 1)
	onThrowawayThread(func() { errc <- setup(opts, pins) })
	return <-errc
}

// onThrowawayThread runs f on a locked OS thread that ends when f returns.
func onThrowawayThread(f func()) {
	go func() {
		runtime.LockOSThread()
		throwaway(f)
	}()
}

// throwaway runs f on the calling goroutine's locked thread and leaves it
// locked, so that the thread ends with the goroutine. The main thread cannot
// end (exiting locked only parks it, still holding whatever namespaces f
// entered), so from there f hops to a new thread: while the main thread
// stays locked, the new goroutine cannot be scheduled on it.
func throwaway(f func()) {
	if unix.Gettid() != unix.Getpid() {
		f()
		return
	}
	started := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(started)
		f()
	}()
	<-started
	runtime.UnlockOSThread()
}

// setup runs on the throwaway thread. Pins are mounted first so that a
// failure in the later steps exercises the same cleanup as any other.
func setup(opts Options, pins map[Kind]string) error {
	flags := 0
	for k := range pins {
		flags |= cloneFlags[k]
	}
	if err := unix.Unshare(flags); err != nil {
		return fmt.Errorf("podns: unshare: %w", err)
	}
	for _, k := range slices.Sorted(maps.Keys(pins)) {
		if err := pin(k, pins[k]); err != nil {
			return err
		}
	}
	return configure(opts, pins)
}

// configure brings lo up and sets the hostname and sysctls, on a thread that
// is in the pod's namespaces.
func configure(opts Options, pins map[Kind]string) error {
	if _, ok := pins[Net]; ok {
		if err := loopbackUp(); err != nil {
			return err
		}
	}
	if _, ok := pins[UTS]; ok && opts.Hostname != "" {
		if err := unix.Sethostname([]byte(opts.Hostname)); err != nil {
			return fmt.Errorf("podns: set hostname %q: %w", opts.Hostname, err)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(opts.Sysctls)) {
		if err := writeSysctl(key, opts.Sysctls[key]); err != nil {
			return err
		}
	}
	return nil
}

// pin bind-mounts this thread's namespace of kind k over its empty file.
func pin(k Kind, path string) error {
	// thread-self, not self: self would name the main thread's namespace.
	src := "/proc/thread-self/ns/" + string(k)
	if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("podns: pin %s: %w", path, err)
	}
	return nil
}

// loopbackUp sets IFF_UP on lo with an ioctl; the socket is created on this
// thread and so belongs to the new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("podns: lo up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("podns: lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("podns: lo up: %w", err)
	}
	return nil
}
