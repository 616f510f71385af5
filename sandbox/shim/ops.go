package shim

import specs "github.com/opencontainers/runtime-spec/specs-go"

// The shim that stays for a pod's lifetime never runs libcontainer: a
// process that has leaves its caches, encoders and runtime metadata
// resident (about 1.7 MiB per pod). That work is berth-shim-helper's, the
// binary installed beside the shim, which the shim starts in one of two
// roles (the names below keep them apart):
//
//   - an op process does one operation (OpCreate, OpExec, OpUpdate,
//     OpDelete, OpState, OpKill, OpCheckpoint, OpRestore, OpUnlockNetwork) and exits.
//     The shim hands it the request and the process's stdio and lets it
//     go once it has the reply: the container's init, or the exec'd
//     process, is the op process's child until then, and the shim's (a
//     child subreaper) once it exits, so the shim can register the pid
//     before its exit can be reaped.
//   - the exec server (ExecServerArg) serves execs for a while.
//
// An op process's exchange: the request, JSON, on its stdin; the reply,
// JSON, on its stdout; the shim then closes its stdin, and it exits. Its
// stderr is the shim's log. The stdio the request names (OpStdio) are its
// fds from 3 on.

// OpsArg is berth-shim-helper's first argument for either role (its other
// mode, "init", is libcontainer's container init).
const OpsArg = "helper"

// ExecServerArg, after OpsArg, makes berth-shim-helper the exec server: it
// serves execs (OpExec only) on its fd 3, a SOCK_SEQPACKET socket, one
// message a request with the stdio fds (WriteStreamMsg), until the shim
// hangs up. The started process stays the exec server's child: it waits
// for it after the shim has registered it (an OpRegistered message) and
// reports its exit (OpReply.Exited). The shim keeps the exec server while
// execs come in close to each other (ExecSync probes, a client's loop), and
// hangs up once none came for a moment: one exec then costs what it did
// when the shim ran libcontainer itself, not a process start. Its last
// argument is the pod folder, so that it is seen (and counted) as the pod's.
const ExecServerArg = "--serve"

// OpRegistered tells the exec server that the shim has registered the pid
// of its last reply (OpRequest.Pid): it may wait for it now.
const OpRegistered = "registered"

// HelperBinary is berth-shim-helper's file name, beside the shim's binary.
const HelperBinary = "berth-shim-helper"

// Operations, OpRequest.Op.
const (
	// OpCreate creates a container and spawns its init, which waits
	// for the shim to open the exec fifo (ExecFifo).
	OpCreate = "create"
	// OpExec starts a process in a running container.
	OpExec = "exec"
	// OpUpdate applies new limits (OpRequest.Resources) and records
	// them in the bundle's spec.
	OpUpdate = "update"
	// OpDelete removes a stopped container's cgroup and state.
	OpDelete = "delete"
	// OpState and OpKill are for containers of an earlier shim of
	// the pod, known only by libcontainer's state.
	OpState = "state"
	OpKill  = "kill"
	// OpCheckpoint has CRIU checkpoint a running container
	// (OpRequest.Checkpoint), which runs on.
	OpCheckpoint = "checkpoint"
	// OpRestore creates a container and has CRIU restore its processes
	// (OpRequest.Restore) instead of starting its init.
	OpRestore = "restore"
	// OpUnlockNetwork removes the network lock a CRIU killed mid-dump
	// left in the network namespace of the process OpRequest.Pid.
	OpUnlockNetwork = "unlock-network"
)

// ExecFifo is the fifo in a container's libcontainer state folder that its
// init waits on: opening it for reading lets the init exec the process.
const ExecFifo = "exec.fifo"

// OpRequest is one operation, for an op process or the exec server.
type OpRequest struct {
	Op string
	ID string
	// Root is libcontainer's state root (the pod's StateRoot).
	Root string
	// Bundle holds the container's config.json.
	Bundle string
	Stdio  OpStdio
	// Exec: the command and what it changes from the container's process.
	Exec *ExecRequest `json:",omitempty"`
	// Update: the new limits.
	Resources *specs.LinuxResources `json:",omitempty"`
	// Checkpoint: where CRIU writes.
	Checkpoint *CheckpointRequest `json:",omitempty"`
	// Restore: the checkpoint's folders.
	Restore *RestoreRequest `json:",omitempty"`
	// Kill: the signal, and whether to every process in the cgroup.
	Signal int
	All    bool
	// OpRegistered: the pid. OpExec: the container's init's pid,
	// which the exec server keys what it keeps of the container by.
	// OpUnlockNetwork: a process in the network namespace to unlock.
	Pid int `json:",omitempty"`
}

// OpStdio says which of the process's standard streams berth-shim-helper was
// handed, as its fds from 3 on in this order: with TTY, the console socket
// alone (the process's pty master is sent over it); else stdin, stdout and
// stderr, each when set.
type OpStdio struct {
	Stdin, Stdout, Stderr, TTY bool
}

// Count is how many fds the stdio takes.
func (s OpStdio) Count() int {
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

// OpReply is what the op process or the exec server did.
type OpReply struct {
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
	// the shim removes itself on Delete, unless DeleteByOp: then
	// removing the container takes libcontainer (the systemd driver's
	// unit, poststop hooks, Intel RDT) and an op process does it. (An op
	// process per container on every pod's teardown would cost more than
	// the rest of the teardown's steps.) DeleteByOp keeps its JSON name
	// from before the rename: a shim that runs across an upgrade starts
	// the new berth-shim-helper.
	CgroupPaths map[string]string `json:",omitempty"`
	DeleteByOp  bool              `json:"DeleteByHelper,omitempty"`
	// State: the container's status (StatusCreated, StatusRunning,
	// StatusStopped).
	Status string `json:",omitempty"`
	// The exec server's report that its process Exited, with its wait
	// status.
	Exited     int `json:",omitempty"`
	WaitStatus int `json:",omitempty"`
}
