// Package ops is berth-shim-helper's work for a pod's shim: the libcontainer
// operations (create, exec, update, delete, checkpoint, and state and kill
// of containers an earlier shim left), done by an op process (Run: one
// operation, then it exits) or by the exec server (ServeExecs: execs while
// they keep coming), so that the shim, which stays for the pod's lifetime,
// never holds what running libcontainer leaves resident. The exchange is package shim's
// OpRequest and OpReply (see sandbox/shim/ops.go).
package ops

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/utils"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// Run is an op process: it reads the request on stdin, does it, writes the reply on stdout and
// returns once the shim closes stdin: until then the process it started
// stays its child, so the shim cannot reap it before it knows its pid.
func Run() int {
	in := json.NewDecoder(os.Stdin)
	var req shim.OpRequest
	if err := in.Decode(&req); err != nil {
		fmt.Fprintf(os.Stderr, "berth-shim-helper: request: %v\n", err)
		return 2
	}
	files := stdioFiles(req.Stdio.Count())
	reply := do(&req, files)
	for _, f := range files {
		f.Close()
	}
	if err := json.NewEncoder(os.Stdout).Encode(reply); err != nil {
		fmt.Fprintf(os.Stderr, "berth-shim-helper: reply: %v\n", err)
		return 1
	}
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// ServeExecs is the exec server: it serves execs on fd 3 (see
// shim.ExecServerArg) until the shim hangs up. Processes still running then
// become the shim's children (it registered them), and it reaps them.
func ServeExecs() int {
	f := os.NewFile(3, "shim")
	syscall.CloseOnExec(3)
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-shim-helper: serve: %v\n", err)
		return 2
	}
	conn, ok := fc.(*net.UnixConn)
	if !ok {
		fmt.Fprintln(os.Stderr, "berth-shim-helper: serve: fd 3 is not a unix socket")
		return 2
	}
	targets = map[string]target{}
	var send sync.Mutex
	reply := func(r shim.OpReply) error {
		send.Lock()
		defer send.Unlock()
		return shim.WriteStreamMsg(conn, r)
	}
	k := newKeeper()
	for {
		var req shim.OpRequest
		files, err := shim.ReadStreamMsg(conn, &req)
		if err != nil {
			return 0 // the shim hung up
		}
		switch req.Op {
		case shim.OpRegistered:
			go k.waitAndReport(req.Pid, reply)
			continue
		case shim.OpExec:
		default:
			req.Op = "serve " + req.Op // unknown: do says so
		}
		r := k.do(&req, files)
		for _, f := range files {
			f.Close()
		}
		if reply(r) != nil {
			return 0
		}
	}
}

// keeper reaps the exec server's children. A failed exec
// leaves libcontainer's intermediate processes (runc:[1:CHILD],
// runc:[2:INIT]) as the exec server's children, unreaped: libcontainer was
// written for runc, whose process ends after one exec and leaves them to a
// subreaper. The exec server lives on while execs keep coming (probes),
// and a zombie of one that had joined the container's PID namespace keeps
// the container's init from ever finishing its exit: the kernel waits for
// every process of the namespace to be reaped. So the keeper reaps every
// child that is neither an exec'd process (waitAndReport reaps those and
// reports their exit) nor libcontainer's while it works (it waits for its
// own).
type keeper struct {
	mu    sync.Mutex   // held while libcontainer works, and by each sweep
	execs map[int]bool // exec'd processes not yet reaped
}

// newKeeper starts sweeping whenever a child exits (the leftovers of a
// failed exec may end after the exec's reply); a SIGCHLD that comes while
// libcontainer works is swept once it is done.
func newKeeper() *keeper {
	k := &keeper{execs: map[int]bool{}}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			k.mu.Lock()
			k.reapStraysLocked()
			k.mu.Unlock()
		}
	}()
	return k
}

// do does the request with no sweep in between, and keeps the exec'd
// process from the sweeps.
func (k *keeper) do(req *shim.OpRequest, files []*os.File) shim.OpReply {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := do(req, files)
	if r.Error == "" && r.Pid > 0 {
		k.execs[r.Pid] = true
	}
	return r
}

// reapStraysLocked reaps each child that has exited and is not an exec'd
// process. Children are listed per thread (the kernel's
// /proc/self/task/TID/children): the Go runtime forks from any thread.
func (k *keeper) reapStraysLocked() {
	for _, pid := range children() {
		if k.execs[pid] {
			continue
		}
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, unix.WNOHANG, nil) // a child still running is left for a later sweep
	}
}

// children lists this process's children.
func children() []int {
	tasks, _ := os.ReadDir("/proc/self/task")
	var pids []int
	for _, t := range tasks {
		b, _ := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "children"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// waitAndReport waits for a process this exec server started and sends its
// exit.
func (k *keeper) waitAndReport(pid int, reply func(shim.OpReply) error) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			k.forget(pid)
			return // not this exec server's child: the shim reaps it
		}
		break
	}
	k.forget(pid)
	reply(shim.OpReply{Exited: pid, WaitStatus: int(ws)})
}

func (k *keeper) forget(pid int) {
	k.mu.Lock()
	delete(k.execs, pid)
	k.mu.Unlock()
}

// stdioFiles are the n fds the shim handed over from 3 on. They are made
// close-on-exec: libcontainer passes each where it belongs, and no other
// process it starts may inherit them.
func stdioFiles(n int) []*os.File {
	files := make([]*os.File, n)
	for i := range files {
		fd := 3 + i
		syscall.CloseOnExec(fd)
		files[i] = os.NewFile(uintptr(fd), fmt.Sprint("stdio-", i))
	}
	return files
}

func do(req *shim.OpRequest, files []*os.File) shim.OpReply {
	var r shim.OpReply
	var err error
	switch req.Op {
	case shim.OpCreate:
		err = create(req, files, &r)
	case shim.OpExec:
		err = execIn(req, files, &r)
	case shim.OpUpdate:
		err = update(req)
	case shim.OpDelete:
		err = remove(req, &r)
	case shim.OpState:
		err = state(req, &r)
	case shim.OpKill:
		err = kill(req, &r)
	case shim.OpCheckpoint:
		err = checkpoint(req)
	case shim.OpRestore:
		err = restore(req, files, &r)
	case shim.OpUnlockNetwork:
		err = unlockNetwork(req.Pid)
	default:
		err = fmt.Errorf("unknown operation %q", req.Op)
	}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

// setStdio gives the process the fds of stdio, in OpStdio's order.
func setStdio(p *libcontainer.Process, stdio shim.OpStdio, files []*os.File) {
	if stdio.TTY {
		p.ConsoleSocket = files[0]
		return
	}
	next := files
	take := func(want bool) *os.File {
		if !want {
			return nil
		}
		f := next[0]
		next = next[1:]
		return f
	}
	if f := take(stdio.Stdin); f != nil {
		p.Stdin = f
	}
	if f := take(stdio.Stdout); f != nil {
		p.Stdout = f
	}
	if f := take(stdio.Stderr); f != nil {
		p.Stderr = f
	}
}

// create makes the container and spawns its init, which stops at the exec
// fifo ("created") until the shim opens it.
func create(req *shim.OpRequest, files []*os.File, r *shim.OpReply) error {
	return makeContainer(req, files, r, func(c *libcontainer.Container, proc *libcontainer.Process) error {
		return c.Start(proc)
	})
}

// makeContainer makes the container of req's bundle and has run bring its
// init to life (start or restore), with req's stdio; on failure it
// destroys the container.
func makeContainer(req *shim.OpRequest, files []*os.File, r *shim.OpReply, run func(*libcontainer.Container, *libcontainer.Process) error) error {
	spec, err := loadSpec(req.Bundle)
	if err != nil {
		return err
	}
	cfg, err := lcConfig(req.ID, req.Bundle, spec)
	if err != nil {
		return err
	}
	proc, err := lcProcess(spec.Process)
	if err != nil {
		return err
	}
	proc.Init = true
	setStdio(proc, req.Stdio, files)
	c, err := libcontainer.Create(req.Root, req.ID, cfg)
	if err != nil {
		return err
	}
	if err := run(c, proc); err != nil {
		c.Destroy()
		return err
	}
	if r.Pid, err = proc.Pid(); err != nil {
		proc.Signal(unix.SIGKILL)
		c.Destroy()
		return err
	}
	if st, err := c.State(); err == nil {
		r.Cgroup, r.OOMEvents = cgroupFiles(st.CgroupPaths)
		r.CgroupPaths = st.CgroupPaths
	}
	r.DeleteByOp = cfg.Cgroups.Systemd || len(cfg.Hooks[configs.Poststop]) > 0 || cfg.IntelRdt != nil
	if err := saveExecInit(req.ID, req.Bundle, cfg, proc, r.CgroupPaths, r.Pid); err != nil {
		log.Printf("container %s: execs go through libcontainer: %v", req.ID, err)
	}
	return nil
}

// cgroupFiles picks, from a container's cgroup paths, the folder that lists
// its processes and the file that counts its OOM kills: on cgroup v1 the
// devices and memory hierarchies' (those libcontainer itself uses for its
// process list and OOM count), else the unified hierarchy's. (On a hybrid
// host the v1 paths include the unified one too, without controllers.)
func cgroupFiles(paths map[string]string) (procs, oom string) {
	if mem, ok := paths["memory"]; ok {
		procs = paths["devices"]
		if procs == "" {
			procs = mem
		}
		return procs, filepath.Join(mem, "memory.oom_control")
	}
	if p, ok := paths[""]; ok {
		return p, filepath.Join(p, "memory.events")
	}
	return "", ""
}

// execIn starts a process in the container with the container's own
// process settings, less what the request changes.
func execIn(req *shim.OpRequest, files []*os.File, r *shim.OpReply) error {
	if req.Exec == nil || len(req.Exec.Args) == 0 {
		return errors.New("exec: no command")
	}
	t, err := loadTarget(req)
	if err != nil {
		return err
	}
	proc := execProcess(t.base, req.Exec)
	setStdio(proc, req.Stdio, files)
	if err := t.c.Run(proc); err != nil {
		return err
	}
	r.Pid, err = proc.Pid()
	return err
}

// target is what an exec needs of its container: libcontainer's handle
// (its state decoded) and the process settings of its spec.
type target struct {
	initPid int
	c       *libcontainer.Container
	base    *libcontainer.Process
}

// targets keeps, in the exec server, each container's target
// between execs: decoding its spec and its libcontainer state (both carry
// the seccomp profile) took a fifth of an exec's CPU. A container created
// again under the same ID has another init, so the init's pid is part of
// the key. (Update changes only the cgroup's limits, which an exec does
// not apply.)
var targets map[string]target

func loadTarget(req *shim.OpRequest) (target, error) {
	if t, ok := targets[req.ID]; ok && req.Pid > 0 && t.initPid == req.Pid {
		return t, nil
	}
	spec, err := loadSpec(req.Bundle)
	if err != nil {
		return target{}, err
	}
	base, err := lcProcess(spec.Process)
	if err != nil {
		return target{}, err
	}
	c, err := libcontainer.Load(req.Root, req.ID)
	if err != nil {
		return target{}, err
	}
	t := target{initPid: req.Pid, c: c, base: base}
	if targets != nil && req.Pid > 0 {
		targets[req.ID] = t
	}
	return t, nil
}

// execProcess is the exec'd process: the container's own process settings
// (env, cwd, user, rlimits, security labels) unless the request says.
func execProcess(p *libcontainer.Process, req *shim.ExecRequest) *libcontainer.Process {
	proc := &libcontainer.Process{
		Args: req.Args, Env: p.Env, Cwd: p.Cwd, UID: p.UID, GID: p.GID,
		AdditionalGroups: p.AdditionalGroups, Rlimits: p.Rlimits,
		AppArmorProfile: p.AppArmorProfile, Label: p.Label, LogLevel: initLogLevel(),
	}
	if req.Env != nil {
		proc.Env = req.Env
	}
	if req.Cwd != "" {
		proc.Cwd = req.Cwd
	}
	if u := req.User; u != nil {
		proc.UID, proc.GID, proc.AdditionalGroups = int(u.UID), int(u.GID), nil
		for _, g := range u.AdditionalGids {
			proc.AdditionalGroups = append(proc.AdditionalGroups, int(g))
		}
	}
	return proc
}

// update applies new limits through libcontainer, then rewrites the
// bundle's spec so that status and a restarted shim see them. Device rules
// stay as the container was created with.
func update(req *shim.OpRequest) error {
	if req.Resources == nil {
		return errors.New("update: no resources")
	}
	spec, err := loadSpec(req.Bundle)
	if err != nil {
		return err
	}
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	res := *req.Resources
	if spec.Linux.Resources != nil {
		res.Devices = spec.Linux.Resources.Devices
	}
	spec.Linux.Resources = &res
	cfg, err := lcConfig(req.ID, req.Bundle, spec)
	if err != nil {
		return err
	}
	c, err := libcontainer.Load(req.Root, req.ID)
	if err != nil {
		return err
	}
	if err := c.Set(*cfg); err != nil {
		return fmt.Errorf("update %s: %w", req.ID, err)
	}
	return shim.WriteJSONDurable(filepath.Join(req.Bundle, shim.ConfigFile), spec)
}

// load is the container's libcontainer state; r.NotFound when there is
// none.
func load(req *shim.OpRequest, r *shim.OpReply) (*libcontainer.Container, error) {
	c, err := libcontainer.Load(req.Root, req.ID)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, libcontainer.ErrNotExist) {
		r.NotFound = true
		return nil, nil
	}
	return c, err
}

// remove destroys a stopped container: its cgroup, its state, and what is
// left in its cgroup when it shared the pod's PID namespace.
func remove(req *shim.OpRequest, r *shim.OpReply) error {
	c, err := load(req, r)
	if c == nil || err != nil {
		return err
	}
	if st, err := c.Status(); err != nil || st != libcontainer.Stopped {
		return fmt.Errorf("%w: %s", shim.ErrNotStopped, req.ID)
	}
	return c.Destroy()
}

func state(req *shim.OpRequest, r *shim.OpReply) error {
	c, err := load(req, r)
	if c == nil || err != nil {
		return err
	}
	status, err := c.Status()
	if err != nil {
		return err
	}
	switch status {
	case libcontainer.Created:
		r.Status = shim.StatusCreated
	case libcontainer.Stopped:
		r.Status = shim.StatusStopped
	default:
		r.Status = shim.StatusRunning
	}
	if ls, err := c.State(); err == nil && r.Status != shim.StatusStopped {
		r.Pid = ls.InitProcessPid
	}
	return nil
}

func kill(req *shim.OpRequest, r *shim.OpReply) error {
	c, err := load(req, r)
	if c == nil || err != nil {
		return err
	}
	sig := unix.Signal(req.Signal)
	if req.All {
		pids, err := c.Processes()
		if err != nil {
			return nil // no cgroup left: nothing to signal
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, sig); err != nil && err != unix.ESRCH {
				return err
			}
		}
		return nil
	}
	if err := c.Signal(sig); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		return err
	}
	return nil
}

// checkpoint has CRIU, through libcontainer, dump a running container and
// leave it running. Its established TCP connections and external unix
// sockets are not taken: CRIU refuses such a container, naming them, rather
// than berth lock the pod's network while it dumps. A failure carries
// CRIU's own reason, from its log, after shim.ErrCheckpoint.
func checkpoint(req *shim.OpRequest) error {
	cr := req.Checkpoint
	if cr == nil || cr.ImagesDir == "" || cr.WorkDir == "" {
		return errors.New("checkpoint: no folders")
	}
	c, err := libcontainer.Load(req.Root, req.ID)
	if err != nil {
		return err
	}
	// Paused: a pod checkpoint freezes all its containers first; CRIU
	// dumps a frozen cgroup and leaves it frozen.
	if st, err := c.Status(); err != nil || (st != libcontainer.Running && st != libcontainer.Paused) {
		return fmt.Errorf("%w: %s", shim.ErrNotRunning, req.ID)
	}
	if err := checkCRIUConfig(req.ID, c.Config(), req.Bundle); err != nil {
		return err
	}
	err = c.Checkpoint(&libcontainer.CriuOpts{
		ImagesDirectory: cr.ImagesDir,
		WorkDirectory:   cr.WorkDir,
		LeaveRunning:    true,
		FileLocks:       true,
		// The network namespace is the pod's (libcontainer names it
		// external to CRIU): its links, addresses, routes and rules
		// are berth's, made again for a restored pod, not the container's
		// to save.
		EmptyNs:  unix.CLONE_NEWNET,
		StatusFd: -1,
	})
	if err != nil {
		return fmt.Errorf("%w %s: %v%s", shim.ErrCheckpoint, req.ID, err, criuErrors(filepath.Join(cr.WorkDir, dumpLog)))
	}
	return nil
}

// checkCRIUConfig makes sure that CRIU, which runs as the node's root,
// takes berth's configuration and no other: libcontainer gives CRIU the file
// the container's label org.criu.config names (shim.AnnotationCRIUConfig),
// which berth sets to the one in the bundle, and without the label the
// host's /etc/criu/runc.conf. CRIU also reads the file CRIU_CONFIG_FILE
// names, which this process does not pass on.
func checkCRIUConfig(id string, cfg configs.Config, bundle string) error {
	want := filepath.Join(bundle, shim.CRIUConfigFile)
	if got, _ := utils.SearchLabels(cfg.Labels, shim.AnnotationCRIUConfig); got != want {
		return fmt.Errorf("%w %s: its spec does not name berth's CRIU configuration (%s=%q): it was created by a berth from before checkpoints; a container created now can be checkpointed",
			shim.ErrCheckpoint, id, shim.AnnotationCRIUConfig, got)
	}
	return os.Unsetenv("CRIU_CONFIG_FILE")
}

// restore makes the container and has CRIU, through libcontainer, restore
// its processes from a checkpoint, running, in the container's namespaces
// and cgroup: the pod's network namespace is given to CRIU as the external
// one the checkpoint left out. A failure carries CRIU's own reason, from
// its log, after shim.ErrRestore; libcontainer's Destroy has removed the
// container's cgroup and state, and CRIU kills what it had restored.
func restore(req *shim.OpRequest, files []*os.File, r *shim.OpReply) error {
	rr := req.Restore
	if rr == nil || rr.ImagesDir == "" || rr.WorkDir == "" {
		return errors.New("restore: no folders")
	}
	return makeContainer(req, files, r, func(c *libcontainer.Container, proc *libcontainer.Process) error {
		if err := checkCRIUConfig(req.ID, c.Config(), req.Bundle); err != nil {
			return err
		}
		err := c.Restore(proc, &libcontainer.CriuOpts{
			ImagesDirectory: rr.ImagesDir,
			WorkDirectory:   rr.WorkDir,
			FileLocks:       true,
			EmptyNs:         unix.CLONE_NEWNET,
			StatusFd:        -1,
		})
		if err != nil {
			return fmt.Errorf("%w %s: %v%s", shim.ErrRestore, req.ID, err, criuErrors(filepath.Join(rr.WorkDir, restoreLog)))
		}
		return nil
	})
}

// dumpLog and restoreLog are the logs libcontainer has CRIU write in the
// work folder.
const (
	dumpLog    = "dump.log"
	restoreLog = "restore.log"
)

// criuErrors are the error lines of CRIU's log, which say why it failed
// where its RPC answer only says that it did ("criu failed: type DUMP
// errno 0"); "" when there are none.
func criuErrors(log string) string {
	b, err := os.ReadFile(log)
	if err != nil {
		return ""
	}
	var lines []string
	for l := range strings.Lines(string(b)) {
		if strings.Contains(l, "Error (") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	// The first errors are the cause; the last, CRIU's unwinding.
	if len(lines) > 4 {
		lines = lines[:4]
	}
	if len(lines) == 0 {
		return ""
	}
	return ": criu's log: " + strings.Join(lines, "; ")
}

// criuUnlock is CRIU's own network unlock (criu/net.c), for iptables-restore
// --noflush: its chain CRIU, which drops every packet but CRIU's, and the
// jumps to it.
const criuUnlock = "*filter\n:CRIU - [0:0]\n-D INPUT -j CRIU\n-D OUTPUT -j CRIU\n-X CRIU\nCOMMIT\n"

// unlockNetwork undoes CRIU's network lock in the network namespace of pid.
// CRIU locks the namespace of the container it dumps (iptables rules that
// drop every packet), and unlocks it when it is done or fails; a CRIU
// killed at the checkpoint's timeout does neither, and the pod would stay
// cut off. A family without CRIU's chain was not locked.
func unlockNetwork(pid int) error {
	if pid <= 0 {
		return errors.New("unlock network: no process")
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return fmt.Errorf("unlock network: %w", err)
	}
	defer ns.Close()
	// The commands are forked from this thread, in the namespace it
	// joins; the op process ends after, so the thread is not given back.
	runtime.LockOSThread()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unlock network: join the namespace of %d: %w", pid, err)
	}
	var errs []error
	for _, tool := range []string{"iptables", "ip6tables"} {
		if exec.Command(tool, "-w", "-S", "CRIU").Run() != nil {
			continue
		}
		cmd := exec.Command(tool+"-restore", "-w", "--noflush")
		cmd.Stdin = strings.NewReader(criuUnlock)
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s-restore: %v: %s", tool, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}
