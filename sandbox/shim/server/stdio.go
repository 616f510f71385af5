package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/shim/crilog"
)

// stdio is a container's side of its init's standard streams; the other
// ends (child) go to the op process that creates it.
type stdio struct {
	stdin   io.WriteCloser // kept open so the container sees an open stdin
	out     *os.File       // stdout, or the pty master
	err     *os.File       // stderr; nil with a tty
	child   []*os.File     // the container's ends (shim.OpStdio's order), closed once it has them
	console *os.File       // our end of the console socket (tty)
	done    chan struct{}  // closed when output copying ended
	fan     fanout         // attached clients
}

func newStdio(stdin, tty bool) (_ *stdio, err error) {
	s := &stdio{done: make(chan struct{})}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if tty {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		s.console = os.NewFile(uintptr(fds[0]), "console-p")
		child := os.NewFile(uintptr(fds[1]), "console-c")
		s.child = append(s.child, child)
		return s, nil
	}
	if stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.stdin = w
		s.child = append(s.child, r)
	}
	for range 2 { // stdout, stderr
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.child = append(s.child, w)
		if s.out == nil {
			s.out = r
		} else {
			s.err = r
		}
	}
	return s, nil
}

// opStdio describes the child ends for the op process.
func (s *stdio) opStdio() shim.OpStdio {
	if s.console != nil {
		return shim.OpStdio{TTY: true}
	}
	return shim.OpStdio{Stdin: s.stdin != nil, Stdout: true, Stderr: true}
}

// started runs after the spawn: drop the container's ends, receive the
// pty master for a tty, and start copying output into the log.
func (s *stdio) started(log *crilog.Writer, stdin bool) error {
	for _, f := range s.child {
		f.Close()
	}
	s.child = nil
	if s.console != nil {
		m, err := recvFile(s.console)
		s.console.Close()
		s.console = nil
		if err != nil {
			return fmt.Errorf("receive pty: %w", err)
		}
		clearONLCR(m)
		s.out = m
		if stdin {
			s.stdin = m
		}
	}
	var wg sync.WaitGroup
	for _, x := range []struct {
		name string
		f    *os.File
	}{{crilog.Stdout, s.out}, {crilog.Stderr, s.err}} {
		if x.f != nil {
			wg.Go(func() { log.Copy(x.name, s.fan.tee(x.name, x.f)) })
		}
	}
	go func() { wg.Wait(); close(s.done) }()
	return nil
}

// drain waits for the output to reach EOF, which it does when every
// process holding the other ends is gone. A process that escaped (shared
// PID namespace, daemonised child) could hold them forever, so the wait is
// bounded; then the read ends are closed.
func (s *stdio) drain(limit time.Duration) {
	select {
	case <-s.done:
	case <-time.After(limit):
	}
	s.close()
}

func (s *stdio) close() {
	for _, f := range append(s.child, s.out, s.err, s.console) {
		if f != nil {
			f.Close()
		}
	}
	if s.stdin != nil {
		s.stdin.Close()
	}
}

// recvFile receives the pty master runc init sends over the console
// socket (it was sent before the spawn returned; the timeout is a guard).
func recvFile(sock *os.File) (*os.File, error) {
	raw, err := sock.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	var n, oobn int
	cerr := raw.Control(func(fd uintptr) {
		tv := unix.Timeval{Sec: 10}
		if err = unix.SetsockoptTimeval(int(fd), unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return
		}
		n, oobn, _, _, err = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, errors.New("no fd in console message")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, errors.New("no fd in console message")
	}
	// Non-blocking so that the runtime poller can interrupt reads on close.
	unix.SetNonblock(fds[0], true)
	return os.NewFile(uintptr(fds[0]), string(buf[:n])), nil
}

// clearONLCR keeps the pty from turning "\n" into "\r\n" in the log.
// (Through SyscallConn: File.Fd would switch the file to blocking mode.)
func clearONLCR(f *os.File) {
	raw, err := f.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		if err != nil {
			return
		}
		t.Oflag &^= unix.ONLCR
		unix.IoctlSetTermios(int(fd), unix.TCSETS, t)
	})
}

// feedStdin copies an attached client's stdin into the container's until
// it ends; with once (stdin_once), the container's stdin then ends too: the
// pipe is closed, or a tty gets an EOF character (closing the pty master
// would hang up the container and end its output).
func (s *stdio) feedStdin(in io.Reader, once bool) {
	if s.stdin == nil {
		return
	}
	io.Copy(s.stdin, in)
	if !once {
		return
	}
	if s.stdin == io.WriteCloser(s.out) {
		s.stdin.Write([]byte{4})
	} else {
		s.stdin.Close()
	}
}

// resize sets the tty's window size (nothing without a tty: the ioctl
// fails on a pipe).
func (s *stdio) resize(width, height uint16) {
	if s.out == nil {
		return
	}
	raw, err := s.out.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: height, Col: width})
	})
}
