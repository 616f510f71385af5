package integration

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// stuckFS is a FUSE filesystem the test serves itself, which never answers
// a lookup of the name "stuck". Once the server has read a request, the
// kernel waits for its answer uninterruptibly (fuse request_wait_answer), so
// a process looking "stuck" up survives SIGKILL, on cgroup v1 and v2 alike,
// until the connection is aborted (release).
type stuckFS struct {
	dir    string
	source string // the mount's source, unique to this test process
	dev    *os.File
	// waiting is closed once the server has read the lookup of "stuck".
	waiting chan struct{}
}

// The FUSE protocol (include/uapi/linux/fuse.h): the opcodes used here,
// and the sizes of the headers.
const (
	fuseLookup      = 1
	fuseForget      = 2
	fuseGetattr     = 3
	fuseInit        = 26
	fuseInterrupt   = 36
	fuseBatchForget = 42

	fuseInHeaderLen  = 40
	fuseOutHeaderLen = 16
	fuseRootID       = 1
	// fuseMinor is the protocol minor this server speaks: above 22, the
	// kernel takes the 64-byte fuse_init_out; above 9, the 104-byte
	// fuse_attr_out.
	fuseMinor = 31
)

// mountStuckFS mounts a stuckFS on a new folder and serves it until the
// test ends, or release.
func mountStuckFS(t *testing.T) *stuckFS {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/fuse (is the fuse module loaded?): %v", err)
	}
	s := &stuckFS{
		dir:     t.TempDir(),
		source:  "berth-stuckfs-" + strconv.Itoa(os.Getpid()),
		waiting: make(chan struct{}),
	}
	// allow_other: the container's root may be another user (a user
	// namespace) than the mount's owner.
	opts := "fd=" + strconv.Itoa(fd) + ",rootmode=40000,user_id=0,group_id=0,allow_other"
	if err := unix.Mount(s.source, s.dir, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Fatalf("mount fuse on %s: %v", s.dir, err)
	}
	// Non-blocking, so that the Go poller parks a reader and Close ends it;
	// only now, as before the mount /dev/fuse polls as an error and epoll
	// would never hear of requests.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		unix.Unmount(s.dir, unix.MNT_DETACH)
		t.Fatal(err)
	}
	s.dev = os.NewFile(uintptr(fd), "/dev/fuse")
	// Before TempDir's removal (cleanups run last first); release first, as
	// the unmount would otherwise wait for the server's answer to DESTROY.
	t.Cleanup(func() {
		s.release()
		unix.Unmount(s.dir, unix.MNT_DETACH)
	})
	go s.serve()
	return s
}

// unmount unmounts the folder, which fails while it is in use.
func (s *stuckFS) unmount(t *testing.T) {
	t.Helper()
	if err := unix.Unmount(s.dir, 0); err != nil {
		t.Errorf("unmount the FUSE folder: %v", err)
	}
}

// release aborts the connection (closing the last /dev/fuse file does):
// every request waiting for an answer ends with an error.
func (s *stuckFS) release() { s.dev.Close() }

// serve answers requests until the connection ends. A read returns exactly
// one request; the buffer must hold the largest the kernel may send.
func (s *stuckFS) serve() {
	buf := make([]byte, 1<<17)
	for {
		n, err := s.dev.Read(buf)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINTR) {
			continue // a request interrupted before it was read
		}
		if err != nil || n < fuseInHeaderLen {
			return
		}
		s.handle(buf[:n])
	}
}

// handle answers one request: INIT, GETATTR of the root, LOOKUPs with
// ENOENT, except that of "stuck", and anything else with ENOSYS. FORGETs and
// INTERRUPTs take no answer.
func (s *stuckFS) handle(req []byte) {
	le := binary.LittleEndian
	opcode, unique, node := le.Uint32(req[4:]), le.Uint64(req[8:]), le.Uint64(req[16:])
	arg := req[fuseInHeaderLen:]
	switch {
	case opcode == fuseForget || opcode == fuseBatchForget || opcode == fuseInterrupt:
	case opcode == fuseInit:
		s.reply(unique, 0, initOut(le.Uint32(arg[4:]), le.Uint32(arg[8:])))
	case opcode == fuseGetattr && node == fuseRootID:
		s.reply(unique, 0, rootAttrOut())
	case opcode == fuseLookup && string(bytes.TrimRight(arg, "\x00")) == "stuck":
		// Never answered. A second lookup (another process) waits too.
		select {
		case <-s.waiting:
		default:
			close(s.waiting)
		}
	case opcode == fuseLookup:
		s.reply(unique, unix.ENOENT, nil)
	default:
		s.reply(unique, unix.ENOSYS, nil)
	}
}

// reply writes an answer: fuse_out_header, then the payload, in one write.
func (s *stuckFS) reply(unique uint64, errno unix.Errno, payload []byte) {
	out := make([]byte, fuseOutHeaderLen, fuseOutHeaderLen+len(payload))
	binary.LittleEndian.PutUint32(out[0:], uint32(fuseOutHeaderLen+len(payload)))
	binary.LittleEndian.PutUint32(out[4:], uint32(-int32(errno)))
	binary.LittleEndian.PutUint64(out[8:], unique)
	s.dev.Write(append(out, payload...))
}

// initOut is fuse_init_out: protocol 7.min(kernel's, fuseMinor), no
// optional features.
func initOut(minor, maxReadahead uint32) []byte {
	out := make([]byte, 64)
	le := binary.LittleEndian
	le.PutUint32(out[0:], 7)
	le.PutUint32(out[4:], min(minor, fuseMinor))
	le.PutUint32(out[8:], maxReadahead)
	le.PutUint32(out[20:], 4096) // max_write
	return out
}

// rootAttrOut is fuse_attr_out for the root: an empty folder, its
// attributes valid for no time (every stat asks again).
func rootAttrOut() []byte {
	out := make([]byte, 104)
	attr := out[16:] // after attr_valid, attr_valid_nsec, dummy
	le := binary.LittleEndian
	le.PutUint64(attr[0:], fuseRootID)          // ino
	le.PutUint32(attr[60:], unix.S_IFDIR|0o755) // mode
	le.PutUint32(attr[64:], 2)                  // nlink
	le.PutUint32(attr[80:], 4096)               // blksize
	return out
}

// mountedAnywhere lists the processes whose mount namespace still holds a
// mount from source.
func mountedAnywhere(source string) []string {
	files, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	var pids []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), " "+source+" ") {
			pids = append(pids, filepath.Base(filepath.Dir(f)))
		}
	}
	return pids
}
