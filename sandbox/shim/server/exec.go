package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

func (s *Server) exec(req *shim.ExecRequest) (shim.ExecResponse, error) {
	cancelled := s.trackExec(req.Token)
	defer s.cancelExec(req.Token)
	c, err := s.runningCtr(req.ID, req.Args)
	if err != nil {
		return shim.ExecResponse{}, err
	}
	limit := req.MaxOutput
	if limit <= 0 {
		limit = shim.DefaultMaxOutput
	}
	out := newCapture(limit)
	outR, outW, err := os.Pipe()
	if err != nil {
		return shim.ExecResponse{}, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return shim.ExecResponse{}, err
	}
	var sp *spawned
	if base := s.execSettings(c); base != nil {
		sp, err = s.spawnExecInit(c, base, req, false, [3]*os.File{nil, outW, errW})
	} else {
		s.mu.Lock()
		initPid := c.state.Pid
		s.mu.Unlock()
		sp, err = s.execViaServer(&shim.OpRequest{Op: shim.OpExec, ID: c.id, Bundle: c.bundle, Pid: initPid,
			Stdio: shim.OpStdio{Stdout: true, Stderr: true}, Exec: req}, []*os.File{outW, errW})
	}
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return shim.ExecResponse{}, err
	}
	out.read(outR, errR)

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	defer sp.close()
	var resp shim.ExecResponse
	var e exit
	select {
	case e = <-sp.exited:
	case <-timeout:
		resp.TimedOut = true
		killTree(sp)
		e = <-sp.exited
	case <-cancelled:
		// Nobody waits for the output: stop the command rather than keep
		// buffering it until it ends.
		killTree(sp)
		e = <-sp.exited
	}
	out.finish(drainLimit)
	if out.total > 1<<20 {
		s.trimSoon() // a big capture: give it back once the reply is sent
	}
	resp.ExitCode, _ = e.code()
	resp.Stdout, resp.Stderr = out.buf[0].Bytes(), out.buf[1].Bytes()
	return resp, nil
}

var errNoCommand = errors.New("exec: no command")

// trackExec returns what closes when the exec named token is cancelled (a
// nil channel, never ready, for an exec without a token).
func (s *Server) trackExec(token string) <-chan struct{} {
	if token == "" {
		return nil
	}
	ch := make(chan struct{})
	s.mu.Lock()
	s.execs[token] = ch
	s.mu.Unlock()
	return ch
}

// cancelExec tells the exec named token that its caller has gone, and
// forgets the token (the exec calls it too, when it ends). A cancel that
// overtakes its exec on the way in finds nothing: that exec runs its course.
func (s *Server) cancelExec(token string) {
	if token == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.execs[token]; ok {
		close(ch)
		delete(s.execs, token)
	}
}

// runningCtr is the container an exec of args runs in; it must be running.
func (s *Server) runningCtr(id string, args []string) (*ctr, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	status := c.state.Status
	s.mu.Unlock()
	if status != shim.StatusRunning {
		return nil, fmt.Errorf("%w: %s is %s", shim.ErrNotRunning, id, status)
	}
	if len(args) == 0 {
		return nil, errNoCommand
	}
	return c, nil
}

// spawnExec has an op process start req's command in c with the container's
// own process settings, less what req changes, with files as its stdio.
func (s *Server) spawnExec(c *ctr, req *shim.ExecRequest, stdio shim.OpStdio, files []*os.File) (*spawned, error) {
	sp, _, err := s.spawn(&shim.OpRequest{Op: shim.OpExec, ID: c.id, Bundle: c.bundle, Stdio: stdio, Exec: req}, files, nil)
	return sp, err
}

// capture collects stdout and stderr up to a limit the two share. What
// comes after it is read and dropped, as the CRI says (cap the output,
// discard the rest, no error): the command is neither blocked nor killed
// and ends with its own exit code.
type capture struct {
	limit int
	mu    sync.Mutex
	total int
	buf   [2]bytes.Buffer
	files []*os.File
	wg    sync.WaitGroup
}

func newCapture(limit int) *capture {
	return &capture{limit: limit}
}

func (c *capture) read(files ...*os.File) {
	c.files = files
	for i, f := range files {
		c.wg.Go(func() {
			b := make([]byte, 32<<10)
			for {
				n, err := f.Read(b)
				c.add(i, b[:n])
				if err != nil {
					return
				}
			}
		})
	}
}

func (c *capture) add(i int, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keep := min(len(b), c.limit-c.total)
	c.buf[i].Write(b[:keep])
	c.total += keep
}

// finish waits for EOF on both pipes (bounded: a background child of the
// command may hold them), then closes them and waits for the readers.
func (c *capture) finish(limit time.Duration) {
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
	}
	for _, f := range c.files {
		f.Close()
	}
	<-done
}

// killTree kills the exec'd process and everything it started. Each
// process found is stopped first so that it cannot fork while the tree is
// walked, then all are killed. Signals go through pidfds opened while the
// parent link was verified, so a recycled pid is never hit.
func killTree(sp *spawned) {
	pid := sp.pid
	sp.signal(unix.SIGSTOP)
	fds := map[int]int{} // pid -> pidfd of stopped descendants
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for range 20 {
		found := false
		for _, p := range descendants(pid) {
			if _, ok := fds[p.pid]; ok {
				continue
			}
			fd, err := unix.PidfdOpen(p.pid, 0)
			if err != nil {
				continue
			}
			if pp, ok := parentOf(p.pid); !ok || pp != p.ppid {
				unix.Close(fd) // exited and recycled between the scan and the open
				continue
			}
			unix.PidfdSendSignal(fd, unix.SIGSTOP, nil, 0)
			fds[p.pid] = fd
			found = true
		}
		if !found {
			break
		}
	}
	sp.signal(unix.SIGKILL)
	for _, fd := range fds {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}

type procLink struct{ pid, ppid int }

// descendants lists the processes below root, from /proc.
func descendants(root int) []procLink {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := parentOf(pid); ok {
			children[pp] = append(children[pp], pid)
		}
	}
	var out []procLink
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, k := range children[p] {
			out = append(out, procLink{k, p})
			queue = append(queue, k)
		}
	}
	return out
}

// parentOf reads the ppid from /proc/<pid>/stat (after the comm field,
// which may itself contain spaces and parentheses).
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return pp, err == nil
}
