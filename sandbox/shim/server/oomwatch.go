package server

import (
	"log"
	"os"
	"path/filepath"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// oomCounter follows a container's oom_kill count while its cgroup lives.
// Under the systemd cgroup driver, systemd removes a container's scope as
// soon as its last process has exited, often before the shim has reaped
// the init and could read memory.events, and an OOM kill read only at exit
// was lost (critest's OOM spec saw reason "Error"). On cgroup v2 the kernel
// notifies inotify watchers of memory.events whenever a count changes, so
// the counter reads the file on each change and keeps the highest count
// seen; at exit the file, if still there, is read once more. cgroup v1's
// memory.oom_control sends no such notification; its cgroups stay until the
// shim deletes them.
type oomCounter struct {
	path string // memory.events or memory.oom_control; "" when unknown
	base uint64 // the count when the container was created
	seen atomic.Uint64
}

// watchOOM starts counting the OOM kills in the cgroup whose counter file is
// path. The watch ends by itself once the cgroup is removed.
func watchOOM(path string) *oomCounter {
	c := &oomCounter{path: path}
	n, err := oomKills(path)
	if err != nil {
		return c
	}
	c.base = n
	c.seen.Store(n)
	if filepath.Base(path) != "memory.events" {
		return c
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		log.Printf("watch %s: %v (an OOM kill is read at exit only)", path, err)
		return c
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		log.Printf("watch %s: %v (an OOM kill is read at exit only)", path, err)
		return c
	}
	// Non-blocking, so a read parks the goroutine in Go's poller, not a thread.
	go c.follow(os.NewFile(uintptr(fd), "inotify"))
	return c
}

// follow reads the counter after every notification until the watch ends:
// the kernel drops it (IN_IGNORED) when the file goes with its cgroup.
func (c *oomCounter) follow(events *os.File) {
	defer events.Close()
	buf := make([]byte, 64*unix.SizeofInotifyEvent)
	for {
		n, err := events.Read(buf)
		if err != nil {
			return
		}
		_ = c.note() // a failed read (the file going) leaves what was seen
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
			if ev.Mask&unix.IN_IGNORED != 0 {
				return
			}
			b = b[unix.SizeofInotifyEvent+int(ev.Len):]
		}
	}
}

// note reads the counter and keeps it if it is the highest yet.
func (c *oomCounter) note() error {
	n, err := oomKills(c.path)
	if err != nil {
		return err
	}
	for {
		old := c.seen.Load()
		if n <= old || c.seen.CompareAndSwap(old, n) {
			return nil
		}
	}
}

// killed says whether the kernel OOM-killed a process of the container
// since it was created; nil (the create failed) never was.
func (c *oomCounter) killed() bool {
	if c == nil {
		return false
	}
	_ = c.note() // the cgroup may be gone: then what the watch saw stands
	return c.seen.Load() > c.base
}
