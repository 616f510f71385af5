package shim

import specs "github.com/opencontainers/runtime-spec/specs-go"

// The shim that stays for a pod's lifetime never runs libcontainer: a
// process that has leaves its caches, encoders and runtime metadata
// resident (about 1.7 MiB per pod). Creating a container, starting an exec
// in one, changing its limits and deleting it are done each by a helper
// process, berth-shim-helper, which the shim starts, hands the request and
// the process's stdio, and lets go once it has the reply: the container's
// init, or the exec'd process, is the helper's child until then, and the
// shim's (a child subreaper) once the helper exits, so the shim can register
// its pid before its exit can be reaped.
//
// The exchange: the request, JSON, on the helper's stdin; the reply, JSON,
// on its stdout; the shim then closes the helper's stdin, and the helper
// exits. The helper's stderr is the shim's log. The stdio the request names
// (HelperStdio) are the helper's fds from 3 on.

// HelperArg is the helper binary's first argument.
const HelperArg = "helper"

// HelperServeArg, after HelperArg, makes the helper serve execs (HelperExec
// only) on its fd 3, a SOCK_SEQPACKET socket, one message a request with
// the stdio fds (WriteStreamMsg), until the shim hangs up. The started
// process stays the helper's child: the helper waits for it after the shim
// has registered it (a HelperRegistered message) and reports its exit
// (HelperReply.Exited). The shim keeps such a helper while execs come in
// close to each other (ExecSync probes, a client's loop), and hangs up once
// none came for a moment: one exec then costs what it did when the shim ran
// libcontainer itself, not a start of the helper. Its last argument is the
// pod folder, so that the helper is seen (and counted) as the pod's.
const HelperServeArg = "--serve"

// HelperRegistered tells a serving helper that the shim has registered the
// pid of its last reply (HelperRequest.Pid): it may wait for it now.
const HelperRegistered = "registered"

// HelperBinary is the helper's file name, beside the shim's binary.
const HelperBinary = "berth-shim-helper"

// Helper operations.
const (
	// HelperCreate creates a container and spawns its init, which waits
	// for the shim to open the exec fifo (ExecFifo).
	HelperCreate = "create"
	// HelperExec starts a process in a running container.
	HelperExec = "exec"
	// HelperUpdate applies new limits (HelperRequest.Resources) and records
	// them in the bundle's spec.
	HelperUpdate = "update"
	// HelperDelete removes a stopped container's cgroup and state.
	HelperDelete = "delete"
	// HelperState and HelperKill are for containers of an earlier shim of
	// the pod, known only by libcontainer's state.
	HelperState = "state"
	HelperKill  = "kill"
)

// ExecFifo is the fifo in a container's libcontainer state folder that its
// init waits on: opening it for reading lets the init exec the process.
const ExecFifo = "exec.fifo"

// HelperRequest is one helper process's work.
type HelperRequest struct {
	Op string
	ID string
	// Root is libcontainer's state root (the pod's StateRoot).
	Root string
	// Bundle holds the container's config.json.
	Bundle string
	Stdio  HelperStdio
	// Exec: the command and what it changes from the container's process.
	Exec *ExecRequest `json:",omitempty"`
	// Update: the new limits.
	Resources *specs.LinuxResources `json:",omitempty"`
	// Kill: the signal, and whether to every process in the cgroup.
	Signal int
	All    bool
	// HelperRegistered: the pid. HelperExec: the container's init's pid,
	// which a serving helper keys what it keeps of the container by.
	Pid int `json:",omitempty"`
}

// HelperStdio says which of the process's standard streams the helper was
// handed, as its fds from 3 on in this order: with TTY, the console socket
// alone (the process's pty master is sent over it); else stdin, stdout and
// stderr, each when set.
type HelperStdio struct {
	Stdin, Stdout, Stderr, TTY bool
}

// Count is how many fds the stdio takes.
func (s HelperStdio) Count() int {
	if s.TTY {
		return 1
	}
	n := 0
	for _, b := range []bool{s.Stdin, s.Stdout, s.Stderr} {
		if b {
			n++
		}
	}
	return n
}

// HelperReply is what the helper did.
type HelperReply struct {
	// Error is the failure's text (it may start with one of this
	// package's errors, as a shim's replies do).
	Error string `json:",omitempty"`
	// NotFound: libcontainer has no state for the container.
	NotFound bool `json:",omitempty"`
	// Pid of the created init or the started exec.
	Pid int `json:",omitempty"`
	// Create: the container's cgroup folder whose cgroup.procs (and its
	// children's) list the container's processes, and the file with its
	// oom_kill count (memory.events, or memory.oom_control on cgroup v1).
	Cgroup    string `json:",omitempty"`
	OOMEvents string `json:",omitempty"`
	// Create: the container's cgroup folders, one per hierarchy, which
	// the shim removes itself on Delete, unless DeleteByHelper: then
	// removing the container takes libcontainer (the systemd driver's
	// unit, poststop hooks, Intel RDT) and a helper does it. (A helper
	// start per container on every pod's teardown would cost more than the
	// rest of the teardown's steps.)
	CgroupPaths    map[string]string `json:",omitempty"`
	DeleteByHelper bool              `json:",omitempty"`
	// State: the container's status (StatusCreated, StatusRunning,
	// StatusStopped).
	Status string `json:",omitempty"`
	// A serving helper's report that its process Exited, with its wait
	// status.
	Exited     int `json:",omitempty"`
	WaitStatus int `json:",omitempty"`
}
