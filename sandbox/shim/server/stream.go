package server

import (
	"fmt"
	"log"
	"net"
	"os"

	"github.com/opencontainers/runc/libcontainer"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// acceptStreams serves interactive execs (see package shim, stream.go).
func (s *Server) acceptStreams(l *net.UnixListener) {
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			select {
			case <-s.quit:
				return
			default:
			}
			log.Printf("accept stream: %v", err)
			continue
		}
		go s.serveStream(conn)
	}
}

// serveStream runs one interactive exec and reports its exit; when berthd
// hangs up first, the process tree is killed.
func (s *Server) serveStream(conn *net.UnixConn) {
	defer conn.Close()
	var req shim.StreamRequest
	files, err := shim.ReadStreamMsg(conn, &req)
	if err != nil {
		log.Printf("stream request: %v", err)
		return
	}
	if req.Attach {
		s.serveAttach(conn, &req, files)
		return
	}
	proc, pty, exited, pid, err := s.startStream(&req, files)
	for _, f := range files {
		f.Close() // the child has its copies
	}
	if err != nil {
		shim.WriteStreamMsg(conn, shim.StreamStarted{Error: err.Error()})
		return
	}
	var sent []*os.File
	if pty != nil {
		sent = append(sent, pty)
	}
	err = shim.WriteStreamMsg(conn, shim.StreamStarted{}, sent...)
	if pty != nil {
		pty.Close()
	}
	if err != nil {
		killTree(proc, pid)
		<-exited
		return
	}
	hangup := make(chan struct{})
	go func() {
		var v struct{}
		shim.ReadStreamMsg(conn, &v) // nothing more is sent: returns on hang-up
		close(hangup)
	}()
	var e exit
	select {
	case e = <-exited:
	case <-hangup:
		killTree(proc, pid)
		e = <-exited
	}
	code, _ := e.code()
	shim.WriteStreamMsg(conn, shim.StreamExited{ExitCode: code})
}

// startStream spawns the exec with the fds berthd sent, or on a new pty
// whose master it returns.
func (s *Server) startStream(req *shim.StreamRequest, files []*os.File) (proc *libcontainer.Process, pty *os.File, exited chan exit, pid int, err error) {
	want := 0
	for _, b := range []bool{req.Stdin, req.Stdout, req.Stderr} {
		if b && !req.TTY {
			want++
		}
	}
	if len(files) != want {
		return nil, nil, nil, 0, fmt.Errorf("exec stream: %d fds sent, %d expected", len(files), want)
	}
	c, err := s.runningCtr(req.Exec.ID, req.Exec.Args)
	if err != nil {
		return nil, nil, nil, 0, err
	}
	proc = execProcess(c, &req.Exec)
	var io *stdio
	if req.TTY {
		if io, err = newStdio(proc, false, true); err != nil {
			return nil, nil, nil, 0, err
		}
		defer io.close()
	} else {
		next := files
		for _, x := range []struct {
			want bool
			set  func(*os.File)
		}{
			{req.Stdin, func(f *os.File) { proc.Stdin = f }},
			{req.Stdout, func(f *os.File) { proc.Stdout = f }},
			{req.Stderr, func(f *os.File) { proc.Stderr = f }},
		} {
			if x.want {
				x.set(next[0])
				next = next[1:]
			}
		}
	}
	exited = make(chan exit, 1)
	pid, err = s.spawnExec(c, proc, exited)
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if io != nil {
		for _, f := range io.child {
			f.Close()
		}
		io.child = nil
		if pty, err = recvFile(io.console); err != nil {
			killTree(proc, pid)
			<-exited
			return nil, nil, nil, 0, fmt.Errorf("receive pty: %w", err)
		}
	}
	return proc, pty, exited, pid, nil
}
