package shim

import (
	"net"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// seqpacketPair is a connected pair of SOCK_SEQPACKET sockets, as the
// stream socket and the exec server's socket are.
func seqpacketPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestStreamMsgSizes: messages of any size up to the bound arrive whole,
// with their fds, and a hang-up ends the reader.
func TestStreamMsgSizes(t *testing.T) {
	a, b := seqpacketPair(t)
	for _, n := range []int{0, 10, 100 << 10} {
		want := StreamRequest{Exec: ExecRequest{ID: "c", Args: []string{strings.Repeat("x", n)}}, Stdout: true}
		if err := WriteStreamMsg(a, want, os.Stdout); err != nil {
			t.Fatal(err)
		}
		var got StreamRequest
		files, err := ReadStreamMsg(b, &got)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		closeAll(files)
		if len(files) != 1 || got.Exec.ID != "c" || got.Exec.Args[0] != want.Exec.Args[0] || !got.Stdout {
			t.Fatalf("%d bytes: got %d files, %+v", n, len(files), got.Exec.ID)
		}
	}
	a.Close()
	var v StreamExited
	if _, err := ReadStreamMsg(b, &v); err == nil {
		t.Fatal("read after the peer hung up: no error")
	}
}

// TestStreamMsgGarbage: reading a small message allocates about its size,
// not the bound (a MiB per message was the exec server's replies' garbage,
// and a MiB held by every reader waiting on a stream).
func TestStreamMsgGarbage(t *testing.T) {
	a, b := seqpacketPair(t)
	const msgs = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range msgs {
		if err := WriteStreamMsg(a, StreamExited{ExitCode: i}); err != nil {
			t.Fatal(err)
		}
		var got StreamExited
		if _, err := ReadStreamMsg(b, &got); err != nil || got.ExitCode != i {
			t.Fatalf("message %d: %+v, %v", i, got, err)
		}
	}
	runtime.ReadMemStats(&after)
	if perMsg := (after.TotalAlloc - before.TotalAlloc) / msgs; perMsg > 16<<10 {
		t.Fatalf("%d bytes allocated per message of a few bytes", perMsg)
	}
}
