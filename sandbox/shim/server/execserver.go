package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// execLinger is how long the shim keeps the exec server after its last
// exec ended: execs that come closer together than this (a client's loop,
// several probes at once) start none.
const execLinger = 2 * time.Second

// execServer is berth-shim-helper serving execs (shim.ExecServerArg).
type execServer struct {
	conn    *net.UnixConn
	replies chan shim.OpReply
	dead    chan struct{} // closed when the connection ended
	gone    chan struct{} // closed when the process has exited

	mu      sync.Mutex // one request at a time
	running int        // execs started and not exited; guarded by Server.execSrvMu
	idle    *time.Timer
}

// execViaServer starts an exec through the exec server, starting one
// when there is none. The process is the exec server's child: its exit comes
// as a message, or, if the exec server dies first, from the reaper.
func (s *Server) execViaServer(req *shim.OpRequest, files []*os.File) (*spawned, error) {
	req.Root = s.lcRoot
	for try := 0; ; try++ {
		h, err := s.execServerFor()
		if err != nil {
			return nil, err
		}
		sp, sent, err := s.execOn(h, req, files)
		if sent || try > 0 {
			return sp, err
		}
		// The request did not reach it (it had just gone): a new one.
	}
}

// execOn sends the exec to h; sent says whether the exec server got it.
func (s *Server) execOn(h *execServer, req *shim.OpRequest, files []*os.File) (_ *spawned, sent bool, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := shim.WriteStreamMsg(h.conn, req, files...); err != nil {
		s.execDone(h)
		s.retire(h, true)
		return nil, false, fmt.Errorf("exec server: %w", err)
	}
	var r shim.OpReply
	select {
	case r = <-h.replies:
	case <-h.dead:
		return nil, true, errors.New("exec server exited (see shim.log)")
	}
	if r.Error != "" {
		s.execDone(h)
		return nil, true, errors.New(r.Error)
	}
	sp := &spawned{pid: r.Pid, pidfd: -1, exited: make(chan exit, 1)}
	if fd, err := unix.PidfdOpen(r.Pid, 0); err == nil {
		sp.pidfd = fd
	}
	s.reaper.register(r.Pid, func(e exit) {
		s.execDone(h)
		sp.exited <- e
	})
	// Only now may the exec server wait for it: until then its pid cannot be
	// reused, and the pidfd above is the process's.
	if err := shim.WriteStreamMsg(h.conn, &shim.OpRequest{Op: shim.OpRegistered, Pid: r.Pid}); err != nil {
		// The exec server is gone: the process is the shim's child now, and the
		// reaper reports it.
		s.retire(h, true)
	}
	return sp, true, nil
}

// execServerFor returns the exec server, started if there is none, with
// one more exec counted on it.
func (s *Server) execServerFor() (*execServer, error) {
	s.execSrvMu.Lock()
	defer s.execSrvMu.Unlock()
	if h := s.execSrv; h != nil {
		h.running++
		h.idle.Stop()
		return h, nil
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "exec-server"), os.NewFile(uintptr(fds[1]), "exec-server-c")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, err
	}
	p, err := os.StartProcess(s.helperBin, []string{s.helperBin, shim.OpsArg, shim.ExecServerArg, s.dir},
		&os.ProcAttr{Files: []*os.File{nil, nil, os.Stderr, theirs}})
	if err != nil {
		fc.Close()
		return nil, fmt.Errorf("start %s: %w", shim.HelperBinary, err)
	}
	h := &execServer{conn: fc.(*net.UnixConn), replies: make(chan shim.OpReply, 1),
		dead: make(chan struct{}), gone: make(chan struct{}), running: 1}
	s.reaper.register(p.Pid, func(exit) { close(h.gone) })
	p.Release() // the reaper reaps it
	h.idle = time.AfterFunc(execLinger, func() { s.retire(h, false) })
	h.idle.Stop()
	go s.readExecServer(h)
	s.execSrv = h
	return h, nil
}

// readExecServer passes the exec server's replies to the request waiting and
// its exit reports to the reaper's waiters.
func (s *Server) readExecServer(h *execServer) {
	for {
		var r shim.OpReply
		files, err := shim.ReadStreamMsg(h.conn, &r)
		closeFiles(files)
		if err != nil {
			close(h.dead)
			s.retire(h, true)
			return
		}
		if r.Exited > 0 {
			s.reaper.deliver(r.Exited, unix.WaitStatus(r.WaitStatus))
			continue
		}
		h.replies <- r
	}
}

// execDone counts an exec ended; the exec server is let go once none came for
// execLinger.
func (s *Server) execDone(h *execServer) {
	s.execSrvMu.Lock()
	defer s.execSrvMu.Unlock()
	if h.running--; h.running == 0 && s.execSrv == h {
		h.idle.Reset(execLinger)
	}
}

// retire hangs up on the exec server (it exits), unless it is not broken and
// an exec runs through it again (the idle timer fired as one came in).
func (s *Server) retire(h *execServer, broken bool) {
	s.execSrvMu.Lock()
	defer s.execSrvMu.Unlock()
	if !broken && h.running > 0 {
		return
	}
	if s.execSrv == h {
		s.execSrv = nil
	}
	h.conn.Close()
}

// stopExecServer lets the exec server go as the shim exits, and waits
// (a second at most) until it has: nothing of a stopped pod may outlive
// its shim.
func (s *Server) stopExecServer() {
	s.execSrvMu.Lock()
	h := s.execSrv
	s.execSrv = nil
	s.execSrvMu.Unlock()
	if h == nil {
		return
	}
	h.conn.Close()
	select {
	case <-h.gone:
	case <-time.After(time.Second):
	}
}
