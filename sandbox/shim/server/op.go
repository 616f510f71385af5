package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// helperBinary is berth-shim-helper, installed beside the shim's binary.
func helperBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(filepath.Dir(self), shim.HelperBinary)
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("%s not found beside the shim: %w", shim.HelperBinary, err)
	}
	return bin, nil
}

// runOp runs one op process for req, with files as its stdio (see
// shim.OpStdio), and returns its reply. When the op process started a
// process, took runs with its pid before the op process is let go: until
// then the process is the op process's child, so its exit cannot be reaped
// before took has registered it. A failure the op process reports is returned as its
// text, which keeps the prefix of shim's errors for berthd's client.
func (s *Server) runOp(req *shim.OpRequest, files []*os.File, took func(pid int)) (shim.OpReply, error) {
	r, _, err := s.runOpWithin(req, files, took, 0)
	return r, err
}

// runOpWithin is runOp that, once timeout passes (0: never), kills the op
// process and whatever it started (CRIU) with SIGKILL, and reports timedOut.
// The op process then leads a process group of its own, so that one kill
// reaches its children too.
func (s *Server) runOpWithin(req *shim.OpRequest, files []*os.File, took func(pid int), timeout time.Duration) (r shim.OpReply, timedOut bool, err error) {
	req.Root = s.lcRoot
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return shim.OpReply{}, false, err
	}
	defer reqW.Close() // lets the op process exit
	repR, repW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		return shim.OpReply{}, false, err
	}
	defer repR.Close()
	attr := &os.ProcAttr{Files: append([]*os.File{reqR, repW, os.Stderr}, files...)}
	if timeout > 0 {
		attr.Sys = &syscall.SysProcAttr{Setpgid: true}
	}
	p, err := os.StartProcess(s.helperBin, []string{s.helperBin, shim.OpsArg}, attr)
	reqR.Close()
	repW.Close()
	if err != nil {
		return shim.OpReply{}, false, fmt.Errorf("start %s: %w", shim.HelperBinary, err)
	}
	if timeout > 0 {
		pgid := p.Pid
		timer := time.AfterFunc(timeout, func() { unix.Kill(-pgid, unix.SIGKILL) })
		// Stopped once the reply is in (or not coming): a kill after it
		// would hit a group whose work is done, or a recycled pgid. A
		// timer that could not be stopped has fired.
		defer func() { timedOut = !timer.Stop() }()
	}
	p.Release() // the reaper reaps it (wait4(-1))
	if err := json.NewEncoder(reqW).Encode(req); err != nil {
		return shim.OpReply{}, false, fmt.Errorf("%s %s: request: %w", shim.HelperBinary, req.Op, err)
	}
	if err := json.NewDecoder(repR).Decode(&r); err != nil {
		return shim.OpReply{}, false, fmt.Errorf("%s %s exited without a reply (see shim.log): %w", shim.HelperBinary, req.Op, err)
	}
	if r.Error != "" {
		return r, false, errors.New(r.Error)
	}
	if r.Pid > 0 && took != nil {
		took(r.Pid)
	}
	return r, false, nil
}

// spawned is a process an op process or the exec server started for the shim: its pid, a pidfd to
// signal it by (never a recycled pid), and its exit.
type spawned struct {
	pid    int
	pidfd  int
	exited chan exit
}

// spawn has an op process start a process (create or exec) and registers it
// with the reaper; onExit, if set, runs at its exit besides.
func (s *Server) spawn(req *shim.OpRequest, files []*os.File, onExit func(exit)) (*spawned, shim.OpReply, error) {
	sp := &spawned{pidfd: -1, exited: make(chan exit, 1)}
	r, err := s.runOp(req, files, func(pid int) {
		sp.pid = pid
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			sp.pidfd = fd
		}
		s.reaper.register(pid, func(e exit) {
			if onExit != nil {
				onExit(e)
			}
			sp.exited <- e
		})
	})
	if err != nil {
		return nil, r, err
	}
	return sp, r, nil
}

// signal sends sig to the process; one that has exited is not an error.
func (sp *spawned) signal(sig unix.Signal) error {
	if sp.pidfd < 0 {
		return fmt.Errorf("no pidfd for process %d", sp.pid)
	}
	err := unix.PidfdSendSignal(sp.pidfd, sig, nil, 0)
	if err == unix.ESRCH {
		return nil
	}
	return err
}

func (sp *spawned) close() {
	if sp.pidfd >= 0 {
		unix.Close(sp.pidfd)
		sp.pidfd = -1
	}
}
