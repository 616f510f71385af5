package integration

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/test/harness"
)

// socketEvent is one inotify event on the CRI socket's name, with what
// Lstat saw right after it.
type socketEvent struct {
	mask     uint32
	mode     uint32
	uid, gid uint32
	statErr  error
}

// TestSocketRootOnlyFromTheStart watches the CRI socket's folder while
// berthd starts, restarts and stops: the socket's name only ever appears by
// a rename of a socket that is already root's and 0660 (never made in place
// under the umask and changed after), and nothing else is left in the
// folder.
func TestSocketRootOnlyFromTheStart(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	dir, err := os.MkdirTemp("", "berth-sock-") // short: a socket path has 107 bytes at most
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const name = "berth.sock"
	events := watchName(t, dir, name)

	d := harness.StartDaemon(t, harness.Options{Socket: filepath.Join(dir, name)})
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 || entries[0].Name() != name {
		t.Errorf("the socket's folder holds %v (%v), want only %s", entries, err, name)
	}
	d.Restart()
	d.Stop()

	var moves int
	for _, ev := range events() {
		switch {
		case ev.mask&(unix.IN_CREATE|unix.IN_ATTRIB) != 0:
			t.Errorf("%s made or changed in place (inotify mask %#x; mode %o, owner %d:%d, %v)", name, ev.mask, ev.mode, ev.uid, ev.gid, ev.statErr)
		case ev.mask&unix.IN_MOVED_TO != 0:
			moves++
			if ev.statErr != nil || ev.mode&unix.S_IFMT != unix.S_IFSOCK || ev.mode&0o7777 != 0o660 || ev.uid != 0 || ev.gid != 0 {
				t.Errorf("%s as it appeared: mode %o, owner %d:%d (%v); want a socket 0660 of root:root", name, ev.mode, ev.uid, ev.gid, ev.statErr)
			}
		}
	}
	if moves != 2 {
		t.Errorf("%s appeared %d times by a rename, want 2 (start and restart)", name, moves)
	}
}

// watchName watches dir with inotify for events on name, stats name as
// soon as each arrives, and returns a function that ends the watch and
// returns what it saw.
func watchName(t *testing.T, dir, name string) func() []socketEvent {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ATTRIB|unix.IN_DELETE); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: Close ends a Read
	var seen []socketEvent
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
				mask := binary.NativeEndian.Uint32(b[4:])
				size := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
				evName := strings.TrimRight(string(b[unix.SizeofInotifyEvent:size]), "\x00")
				b = b[size:]
				if evName != name {
					continue
				}
				ev := socketEvent{mask: mask}
				var st unix.Stat_t
				if ev.statErr = unix.Lstat(filepath.Join(dir, name), &st); ev.statErr == nil {
					ev.mode, ev.uid, ev.gid = st.Mode, st.Uid, st.Gid
				}
				seen = append(seen, ev)
			}
		}
	}()
	return func() []socketEvent {
		f.Close()
		<-done
		return seen
	}
}
