package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Interactive exec does not go through the calls of wire.go: it needs byte streams. Each
// one is a connection to the shim's stream socket (SOCK_SEQPACKET, so every
// message keeps its bounds):
//
//	berthd → shim  StreamRequest, with the process's stdio fds (SCM_RIGHTS)
//	shim → berthd  StreamStarted, with the pty master for a tty
//	shim → berthd  StreamExited once the process is gone
//
// The data never passes through the shim: the process writes straight to
// berthd's pipes, or berthd reads the pty master. When berthd closes the
// connection before the exit, the shim kills the process tree.

// StreamRequest starts an exec whose stdio berthd holds, or attaches to
// container Exec.ID.
type StreamRequest struct {
	Exec ExecRequest
	// Attach joins the running container's own stdio: the shim writes its
	// output to the stdout/stderr fds sent (as it goes to the log), copies
	// the stdin fd into the container's stdin, and takes StreamResize
	// messages for its tty. Its fds are sent with or without TTY.
	Attach bool
	// TTY runs the command on a new pty; no fds are sent then.
	TTY bool
	// Stdin, Stdout, Stderr say which fds follow, in that order; a stream
	// not sent is /dev/null.
	Stdin, Stdout, Stderr bool
}

// StreamStarted answers a StreamRequest.
type StreamStarted struct {
	Error string
}

// StreamResize, sent by berthd during an attach, resizes the container's tty.
type StreamResize struct {
	Width, Height uint16
}

// StreamExited ends a stream.
type StreamExited struct {
	ExitCode int
}

// maxStreamMsg bounds one message (a request carries a command and env).
const maxStreamMsg = 1 << 20

// Stream is a running interactive exec.
type Stream struct {
	conn *net.UnixConn
	// Pty is the master of the command's terminal (TTY requests only).
	Pty *os.File
}

// StartStream asks the shim serving podDir to run req with files as its
// stdio. The caller may close files once it returns.
func StartStream(ctx context.Context, podDir string, req StreamRequest, files []*os.File) (*Stream, error) {
	conn, err := dialStream(podDir)
	if err != nil {
		return nil, fmt.Errorf("%w: dial shim stream socket in %s: %v", ErrUnavailable, podDir, err)
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	st, err := startStream(conn, req, files)
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return st, nil
}

func startStream(conn *net.UnixConn, req StreamRequest, files []*os.File) (*Stream, error) {
	if err := WriteStreamMsg(conn, req, files...); err != nil {
		return nil, fmt.Errorf("%w: send exec request: %v", ErrUnavailable, err)
	}
	var started StreamStarted
	got, err := ReadStreamMsg(conn, &started)
	if err != nil {
		return nil, fmt.Errorf("%w: exec reply: %v", ErrUnavailable, err)
	}
	if started.Error != "" {
		closeAll(got)
		return nil, remoteError(serverError(started.Error))
	}
	st := &Stream{conn: conn}
	if req.TTY && !req.Attach {
		if len(got) != 1 {
			closeAll(got)
			return nil, errors.New("exec reply: no pty")
		}
		st.Pty = got[0]
	}
	return st, nil
}

// Wait returns the exit code of the command. An error means the shim went
// away before telling it.
func (s *Stream) Wait() (int, error) {
	var e StreamExited
	got, err := ReadStreamMsg(s.conn, &e)
	closeAll(got)
	if err != nil {
		return 0, fmt.Errorf("%w: waiting for exec: %v", ErrUnavailable, err)
	}
	return e.ExitCode, nil
}

// Resize asks the shim to resize an attached container's tty.
func (s *Stream) Resize(width, height uint16) error {
	return WriteStreamMsg(s.conn, StreamResize{Width: width, Height: height})
}

// Close ends the stream; a command still running is killed with what it
// started.
func (s *Stream) Close() error {
	if s.Pty != nil {
		s.Pty.Close()
	}
	return s.conn.Close()
}

// ReadStreamMsg reads one message into v, with the fds that came with it.
// Its buffer is the message's size: readers wait in it for a connection's
// whole life (attach, an exec's stream, the exec server's replies), and a
// buffer of maxStreamMsg each was a MiB of garbage per message and a MiB
// held per waiting reader in the shim (one per pod).
func ReadStreamMsg(conn *net.UnixConn, v any) ([]*os.File, error) {
	size, err := nextMsgSize(conn)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, min(max(size, 1), maxStreamMsg))
	oob := make([]byte, unix.CmsgSpace(4*8))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	files, ferr := parseRights(oob[:oobn])
	if n == 0 {
		closeAll(files)
		return nil, errors.New("connection closed")
	}
	if ferr != nil {
		closeAll(files)
		return nil, ferr
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		closeAll(files)
		return nil, err
	}
	return files, nil
}

// nextMsgSize waits for the next message on conn and returns its size
// without reading it (0 when the other side hung up). On a SOCK_SEQPACKET
// socket, MSG_TRUNC makes recv return a message's real length.
func nextMsgSize(conn *net.UnixConn) (int, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var size int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		size, _, rerr = unix.Recvfrom(int(fd), nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	return size, rerr
}

// WriteStreamMsg sends v with files.
func WriteStreamMsg(conn *net.UnixConn, v any, files ...*os.File) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	_, _, err = conn.WriteMsgUnix(b, oob, nil)
	return err
}

func parseRights(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "stream-fd"))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// StreamPath is the shim's stream socket in podDir.
func StreamPath(podDir string) string { return filepath.Join(podDir, StreamFile) }
