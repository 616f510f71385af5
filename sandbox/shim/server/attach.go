package server

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/shim/crilog"
)

// attachQueue is how many chunks of output an attached client may fall
// behind before it is cut off: a stuck client must not stall the
// container's output (or its log).
const attachQueue = 256

// fanout passes a container's output, on its way to the log, to the
// clients attached at the moment.
type fanout struct {
	mu   sync.Mutex
	subs map[*attacher]struct{}
}

// chunk is a piece of a container's output.
type chunk struct {
	stderr bool
	data   []byte
}

// attacher is one attached client's output queue.
type attacher struct {
	out    chan chunk
	stdout bool
	stderr bool
	cut    chan struct{} // closed when it fell too far behind
	once   sync.Once
}

func (f *fanout) add(a *attacher) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.subs == nil {
		f.subs = map[*attacher]struct{}{}
	}
	f.subs[a] = struct{}{}
}

func (f *fanout) remove(a *attacher) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.subs, a)
}

func (f *fanout) send(stream string, b []byte) {
	stderr := stream == crilog.Stderr
	f.mu.Lock()
	defer f.mu.Unlock()
	for a := range f.subs {
		if (stderr && !a.stderr) || (!stderr && !a.stdout) {
			continue
		}
		select {
		case a.out <- chunk{stderr: stderr, data: append([]byte(nil), b...)}:
		default:
			a.once.Do(func() { close(a.cut) })
		}
	}
}

// tee is r, with what is read from it also sent to the attached clients.
func (f *fanout) tee(stream string, r io.Reader) io.Reader {
	return &teeReader{f: f, stream: stream, r: r}
}

type teeReader struct {
	f      *fanout
	stream string
	r      io.Reader
}

func (t *teeReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.f.send(t.stream, p[:n])
	}
	return n, err
}

// serveAttach connects berthd's pipes to a running container's stdio,
// which the shim holds since the container started: its output from now
// on, its stdin if it was created with one, and resizes of its tty. It ends
// when the container's output ends or berthd hangs up. With stdin_once, the
// container's stdin is closed when the first attach with stdin ends.
func (s *Server) serveAttach(conn *net.UnixConn, req *shim.StreamRequest, files []*os.File) {
	defer closeFiles(files)
	want := 0
	for _, b := range []bool{req.Stdin, req.Stdout, req.Stderr} {
		if b {
			want++
		}
	}
	c, err := s.runningCtr(req.Exec.ID, []string{"attach"})
	if err == nil && (want == 0 || len(files) != want) {
		err = fmt.Errorf("attach stream: %d fds sent, %d expected", len(files), want)
	}
	if err != nil {
		shim.WriteStreamMsg(conn, shim.StreamStarted{Error: err.Error()})
		return
	}
	next := files
	take := func(wanted bool) *os.File {
		if !wanted {
			return nil
		}
		f := next[0]
		next = next[1:]
		return f
	}
	in, out, errOut := take(req.Stdin), take(req.Stdout), take(req.Stderr)
	a := &attacher{out: make(chan chunk, attachQueue), stdout: out != nil, stderr: errOut != nil, cut: make(chan struct{})}
	c.io.fan.add(a)
	defer c.io.fan.remove(a)
	if shim.WriteStreamMsg(conn, shim.StreamStarted{}) != nil {
		return
	}
	if in != nil {
		go c.io.feedStdin(in, c.stdinOnce)
	}
	hangup := make(chan struct{})
	go func() {
		defer close(hangup)
		for {
			var r shim.StreamResize
			if _, err := shim.ReadStreamMsg(conn, &r); err != nil {
				return
			}
			c.io.resize(r.Width, r.Height)
		}
	}()
	for {
		select {
		case ch := <-a.out:
			w := out
			if ch.stderr {
				w = errOut
			}
			if _, err := w.Write(ch.data); err != nil {
				return
			}
		case <-c.io.done:
			shim.WriteStreamMsg(conn, shim.StreamExited{})
			return
		case <-hangup:
			return
		case <-a.cut:
			return
		}
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
