package server

import (
	"fmt"
	"log"
	"net"
	"os"

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
	sp, pty, err := s.startStream(&req, files)
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
	defer sp.close()
	if err != nil {
		killTree(sp)
		<-sp.exited
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
	case e = <-sp.exited:
	case <-hangup:
		killTree(sp)
		e = <-sp.exited
	}
	code, _ := e.code()
	shim.WriteStreamMsg(conn, shim.StreamExited{ExitCode: code})
}

// execStdio are berth-exec-init's fds 0-2 for files in OpStdio's order:
// the console socket first for a tty, nil for a stream not asked for.
func execStdio(o shim.OpStdio, files []*os.File) [3]*os.File {
	var out [3]*os.File
	if o.TTY {
		out[0] = files[0]
		return out
	}
	for i, want := range []bool{o.Stdin, o.Stdout, o.Stderr} {
		if want {
			out[i], files = files[0], files[1:]
		}
	}
	return out
}

// startStream spawns the exec with the fds berthd sent, or on a new pty
// whose master it returns.
func (s *Server) startStream(req *shim.StreamRequest, files []*os.File) (sp *spawned, pty *os.File, err error) {
	want := 0
	for _, b := range []bool{req.Stdin, req.Stdout, req.Stderr} {
		if b && !req.TTY {
			want++
		}
	}
	if len(files) != want {
		return nil, nil, fmt.Errorf("exec stream: %d fds sent, %d expected", len(files), want)
	}
	c, err := s.runningCtr(req.Exec.ID, req.Exec.Args)
	if err != nil {
		return nil, nil, err
	}
	opStdio := shim.OpStdio{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr}
	var io *stdio
	if req.TTY {
		if io, err = newStdio(false, true); err != nil {
			return nil, nil, err
		}
		defer io.close()
		opStdio, files = io.opStdio(), io.child
	}
	if base := s.execSettings(c); base != nil {
		sp, err = s.spawnExecInit(c, base, &req.Exec, req.TTY, execStdio(opStdio, files))
	} else {
		sp, err = s.spawnExec(c, &req.Exec, opStdio, files)
	}
	if err != nil {
		return nil, nil, err
	}
	if io != nil {
		for _, f := range io.child {
			f.Close()
		}
		io.child = nil
		if pty, err = recvFile(io.console); err != nil {
			killTree(sp)
			<-sp.exited
			sp.close()
			return nil, nil, fmt.Errorf("receive pty: %w", err)
		}
	}
	return sp, pty, nil
}
