package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// execInit is berth-exec-init as this shim starts it: the sealed copy
// berthd handed over (shim.ExecInitFdEnv), by a path through this
// process's fd table, so that the child's own fd shuffling before its
// execve cannot touch it.
type execInit struct {
	file    *os.File
	path    string
	devNull *os.File // stdio an exec does not ask for, as libcontainer gives it
}

// openExecInit takes the sealed copy from the environment; nil when the
// shim was started without one (execs then go through libcontainer).
func openExecInit() (*execInit, error) {
	v, ok := os.LookupEnv(shim.ExecInitFdEnv)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(shim.ExecInitFdEnv) // not for berth-shim-helper
	fd, err := strconv.Atoi(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", shim.ExecInitFdEnv, err)
	}
	syscall.CloseOnExec(fd)
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	return &execInit{
		file:    os.NewFile(uintptr(fd), shim.ExecInitBinary),
		path:    fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd),
		devNull: devNull,
	}, nil
}

// execSettings are c's settings for berth-exec-init (saved at create), or
// nil when it has none: then its execs go through libcontainer.
func (s *Server) execSettings(c *ctr) []byte {
	if s.execInit == nil {
		return nil
	}
	c.execInitOnce.Do(func() {
		b, err := os.ReadFile(c.execInitFile())
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "container %s: exec init settings: %v\n", c.id, err)
		}
		c.execInit = b
		c.execCgroup = shim.CloneableCgroup(b)
	})
	return c.execInit
}

// spawnExecInit starts req's command in c through berth-exec-init, with
// stdio as its fds 0-2 (nil: /dev/null; with tty, stdio[0] is the console
// socket the pty master is sent over). It returns once the command runs
// (its execve done), or with the error that kept it from running.
func (s *Server) spawnExecInit(c *ctr, base []byte, req *shim.ExecRequest, tty bool, stdio [3]*os.File) (*spawned, error) {
	settings, err := shim.ExecSettings(base, req, tty, c.execCgroup != "")
	if err != nil {
		return nil, err
	}
	sys := &syscall.SysProcAttr{}
	if c.execCgroup != "" {
		cg, err := os.OpenFile(c.execCgroup, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("exec in %s: cgroup: %w", c.id, err)
		}
		defer cg.Close()
		sys.UseCgroupFD, sys.CgroupFD = true, int(cg.Fd())
	}
	// The init's pidfd names the namespaces to join. It is closed only
	// once the container is deleted, under s.mu; a container that exited
	// meanwhile fails the setns (the pidfd names no process then).
	s.mu.Lock()
	if c.state.Status != shim.StatusRunning || c.init == nil || c.init.pidfd < 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", shim.ErrNotRunning, c.id)
	}
	pfd, err := unix.FcntlInt(uintptr(c.init.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	initFd := os.NewFile(uintptr(pfd), "init-pidfd")
	defer initFd.Close()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer cfgW.Close()
	repR, repW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		return nil, err
	}
	defer repR.Close()
	for i, f := range stdio {
		if f == nil {
			stdio[i] = s.execInit.devNull
		}
	}
	sp := &spawned{pidfd: -1, exited: make(chan exit, 1)}
	// The pidfd from the clone itself: the process may exit, and be reaped,
	// before StartProcess returns.
	sys.PidFD = &sp.pidfd
	attr := &os.ProcAttr{
		Files: []*os.File{stdio[0], stdio[1], stdio[2], initFd, repW, cfgR},
		Sys:   sys,
	}
	sp.pid, err = s.reaper.start(func() (int, error) {
		p, err := os.StartProcess(s.execInit.path, []string{shim.ExecInitBinary}, attr)
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		p.Release() // the reaper reaps it
		return pid, nil
	}, func(e exit) { sp.exited <- e })
	cfgR.Close()
	repW.Close()
	switch {
	case errors.Is(err, unix.EAGAIN) && c.execCgroup != "":
		// The clone into the container's cgroup: its pids limit refuses
		// it, as it refuses the container's own forks.
		return nil, fmt.Errorf("%w%s: exec in %s: clone into its cgroup: %w", shim.ErrPidsLimit, otherPidsLimits, c.id, err)
	case err != nil:
		return nil, fmt.Errorf("start %s: %w", shim.ExecInitBinary, err)
	}
	// Short of a pipe's buffer this never blocks; a longer one is read as it
	// comes, and an exec init that failed before reading makes it EPIPE.
	_, werr := cfgW.Write(settings)
	cfgW.Close()
	report, rerr := io.ReadAll(repR)
	switch {
	case bytes.HasPrefix(report, []byte(shim.PidsLimitReport)):
		err = fmt.Errorf("%w%s: exec in %s: %s", shim.ErrPidsLimit, otherPidsLimits, c.id, report[len(shim.PidsLimitReport):])
	case len(report) > 0:
		err = fmt.Errorf("exec in %s: %s", c.id, report)
	case rerr != nil:
		err = rerr
	case werr != nil:
		err = fmt.Errorf("exec init settings: %w", werr)
	}
	if err != nil {
		<-sp.exited // it exits once it has reported
		sp.close()
		return nil, err
	}
	return sp, nil
}

// otherPidsLimits goes after shim.ErrPidsLimit's text, which is the shim
// protocol's and names the container's limit only: EAGAIN is also what
// the pod's limit, and the node's threads-max or pid_max, answer.
const otherPidsLimits = ", or its pod's, or the node's process limit"
