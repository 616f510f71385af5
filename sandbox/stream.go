package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
)

// TermSize is a terminal's size in characters.
type TermSize struct{ Width, Height uint16 }

// ExecStreams are the client's ends of an interactive exec; a nil one is
// not wanted. With TTY, Stderr is unused and output comes on Stdout.
type ExecStreams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	TTY            bool
	Resize         <-chan TermSize
}

// outputDrain bounds the wait for output after the exec'd process exited
// (a background child may keep the pipes open).
const outputDrain = 2 * time.Second

// ExecStream runs cmd in a running container with the container's own
// setup (as ExecSync) and the client's streams as its stdio, and returns its
// exit code. When ctx ends first, the command and what it started are
// killed.
func (m *Manager) ExecStream(ctx context.Context, id string, cmd []string, s ExecStreams) (int, error) {
	c, err := m.GetContainer(id)
	if err != nil {
		return 0, err
	}
	client, err := m.podShim(c.PodID)
	if err != nil {
		return 0, errkind.Errorf(errkind.FailedPrecondition, "container %s is not running: %v", c.ID, err)
	}
	var p execPipes
	defer p.close()
	req := shim.StreamRequest{Exec: shim.ExecRequest{ID: c.ID, Args: cmd}, TTY: s.TTY}
	if !s.TTY {
		if err := p.open(&req, s); err != nil {
			return 0, err
		}
	}
	st, err := shim.StartStream(ctx, client.PodDir(), req, p.child)
	switch {
	case errors.Is(err, shim.ErrNotRunning), shim.IsNotFound(err):
		return 0, errkind.Errorf(errkind.FailedPrecondition, "container %s is not running", c.ID)
	case errors.Is(err, shim.ErrPidsLimit):
		return 0, errkind.Errorf(errkind.ResourceExhausted, "exec in container %s: %v", c.ID, err)
	case err != nil:
		return 0, err
	}
	defer st.Close()
	p.closeChild()
	var copies sync.WaitGroup
	if s.TTY {
		p.copyTTY(&copies, st.Pty, s)
	} else {
		p.copyPipes(&copies, s)
	}
	code, err := waitStream(ctx, st)
	if err != nil {
		return 0, err
	}
	waitBounded(&copies, outputDrain)
	return code, nil
}

// waitStream waits for the exit; ctx ending closes the stream, which makes
// the shim kill the tree and report.
func waitStream(ctx context.Context, st *shim.Stream) (int, error) {
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	code, err := st.Wait()
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return code, err
}

func waitBounded(wg *sync.WaitGroup, limit time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
	}
}

// execPipes are the pipes of a non-tty exec: child ends go to the shim,
// ours are copied from and to the client.
type execPipes struct {
	child []*os.File
	ours  []*os.File
	stdin *os.File
	out   [2]*os.File
}

func (p *execPipes) open(req *shim.StreamRequest, s ExecStreams) error {
	if s.Stdin != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		p.child, p.ours, p.stdin = append(p.child, r), append(p.ours, w), w
		req.Stdin = true
	}
	for i, wanted := range []bool{s.Stdout != nil, s.Stderr != nil} {
		if !wanted {
			continue
		}
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		p.child, p.ours, p.out[i] = append(p.child, w), append(p.ours, r), r
	}
	req.Stdout, req.Stderr = s.Stdout != nil, s.Stderr != nil
	return nil
}

func (p *execPipes) closeChild() {
	for _, f := range p.child {
		f.Close()
	}
	p.child = nil
}

func (p *execPipes) close() {
	p.closeChild()
	for _, f := range p.ours {
		f.Close()
	}
}

func (p *execPipes) copyPipes(wg *sync.WaitGroup, s ExecStreams) {
	if p.stdin != nil {
		go func() {
			io.Copy(p.stdin, s.Stdin)
			p.stdin.Close()
		}()
	}
	for i, w := range []io.Writer{s.Stdout, s.Stderr} {
		if r := p.out[i]; r != nil {
			wg.Go(func() { io.Copy(w, r) })
		}
	}
}

// copyTTY copies between the client and the pty master and applies
// resizes to it.
func (p *execPipes) copyTTY(wg *sync.WaitGroup, pty *os.File, s ExecStreams) {
	if s.Stdin != nil {
		go io.Copy(pty, s.Stdin)
	}
	if s.Stdout != nil {
		wg.Go(func() { io.Copy(s.Stdout, pty) })
	}
	if s.Resize != nil {
		go func() {
			for size := range s.Resize {
				resize(pty, size)
			}
		}()
	}
}

func resize(pty *os.File, size TermSize) {
	raw, err := pty.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Height, Col: size.Width})
	})
}

// CheckRunning is nil when container id is running: the check before a
// streaming URL is handed out. Unknown: errkind.NotFound; not running:
// errkind.FailedPrecondition.
func (m *Manager) CheckRunning(ctx context.Context, id string) error {
	c, err := m.GetContainer(id)
	if err != nil {
		return err
	}
	if st := m.containerState(c); st.Status != shim.StatusRunning {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running (%s)", c.ID, st.Status)
	}
	return nil
}

// Attach connects the client's streams to a running container's stdio,
// which its shim holds: output from now on, stdin if the container has
// one, resizes of its tty. It returns when the container's output ends or
// ctx does.
func (m *Manager) Attach(ctx context.Context, id string, s ExecStreams) error {
	c, err := m.GetContainer(id)
	if err != nil {
		return err
	}
	client, err := m.podShim(c.PodID)
	if err != nil {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running: %v", c.ID, err)
	}
	var p execPipes
	defer p.close()
	req := shim.StreamRequest{Exec: shim.ExecRequest{ID: c.ID}, Attach: true, TTY: s.TTY}
	if err := p.open(&req, s); err != nil {
		return err
	}
	st, err := shim.StartStream(ctx, client.PodDir(), req, p.child)
	switch {
	case errors.Is(err, shim.ErrNotRunning), shim.IsNotFound(err):
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running", c.ID)
	case err != nil:
		return err
	}
	defer st.Close()
	p.closeChild()
	var copies sync.WaitGroup
	p.copyPipes(&copies, s)
	if s.Resize != nil {
		go func() {
			for size := range s.Resize {
				st.Resize(size.Width, size.Height)
			}
		}()
	}
	_, err = waitStream(ctx, st)
	if err != nil {
		return err
	}
	waitBounded(&copies, outputDrain)
	return nil
}
