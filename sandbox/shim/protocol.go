package shim

import (
	"errors"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ServiceName names the shim's calls on the wire (net/rpc's format, see
// wire.go): ServiceName + "." + the Client method name.
const ServiceName = "Shim"

// Container statuses reported in State.Status.
const (
	StatusCreated = "created"
	StatusRunning = "running"
	StatusStopped = "stopped"
)

// DefaultMaxOutput caps what an Exec captures per call, stdout and stderr
// together, when the request does not say: the CRI's 16 MiB less room for
// the rest of the reply, so that the ExecSync answer fits the 16 MiB
// message that berthd's gRPC server sends and the kubelet's client takes.
const DefaultMaxOutput = 16<<20 - 1<<10

// Errors the shim reports. They cross the wire as text; the client turns
// them back into these values so callers can use errors.Is.
var (
	ErrNotFound   = errors.New("container not found")
	ErrExists     = errors.New("container already exists")
	ErrNotCreated = errors.New("container is not in created state")
	ErrNotRunning = errors.New("container is not running")
	ErrNotStopped = errors.New("container is not stopped")
	ErrBusy       = errors.New("shim has live containers")
	// ErrOutputTooLarge: the message is "output exceeds N bytes". Only
	// shims started by a berth from before the excess was discarded still
	// say it (they killed the command).
	ErrOutputTooLarge = errors.New("output exceeds")
	// ErrNoEvents is returned by Client.Events when the shim predates
	// the call.
	ErrNoEvents = errors.New("shim does not push events")
	// ErrNoCheckpoint is returned by Client.Checkpoint when the shim
	// predates the call.
	ErrNoCheckpoint = errors.New("shim does not checkpoint containers")
	// ErrNoRestore is returned by Client.CreateRestored when the shim
	// predates the call.
	ErrNoRestore = errors.New("shim does not restore containers")
	// ErrUnavailable is returned by the client when the shim cannot be
	// reached (the connection broke: the shim died or exited).
	ErrUnavailable = errors.New("shim unavailable")
	// ErrCheckpoint: CRIU could not checkpoint the container; the message
	// goes on with CRIU's reason, from its log.
	ErrCheckpoint = errors.New("criu could not checkpoint the container")
	// ErrCheckpointTimeout: the checkpoint ran past its time and was
	// stopped; the container was thawed and runs on.
	ErrCheckpointTimeout = errors.New("checkpoint timed out")
	// ErrRestore: CRIU could not restore the container from its
	// checkpoint; the message goes on with CRIU's reason, from its log.
	ErrRestore = errors.New("criu could not restore the container")
	// ErrPidsLimit: an exec's process could not start, the kernel refusing
	// the fork into the container's cgroup (EAGAIN): its pids limit, or
	// its pod's, is reached, or (rarely, the shim being root) the node's
	// threads-max or pid_max, which the same errno reports. The message
	// goes on with those other limits and the refused step. Its text is
	// the shim protocol's (remoteErrors match it by prefix): a berthd
	// matches it from shims of earlier builds still serving their pods.
	ErrPidsLimit = errors.New("the container's pids limit is reached")
)

// remoteErrors are matched by prefix against a server error message.
var remoteErrors = []error{ErrNotFound, ErrExists, ErrNotCreated, ErrNotRunning,
	ErrNotStopped, ErrBusy, ErrOutputTooLarge, ErrCheckpoint, ErrCheckpointTimeout, ErrRestore, ErrPidsLimit}

// IsNotFound reports whether err says the container is unknown.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// Empty is the argument or reply of calls that carry none.
type Empty struct{}

// IDRequest names one container.
type IDRequest struct {
	ID string
}

// CreateRequest prepares a container: its init is spawned and waits (the
// libcontainer "created" state) until Start.
type CreateRequest struct {
	ID string
	// Bundle is the folder holding config.json; relative paths in the
	// spec (root, bind sources) are resolved against it.
	Bundle string
	// LogPath is the absolute CRI log file; empty discards the output.
	LogPath string
	// LogDir is the folder the shim opens LogPath beneath, refusing
	// symlinks below it ("": beneath LogPath's own folder). berthd sends
	// the pod log root, the folder above the pod's log_directory, so that
	// the pod's folder cannot be a symlink either.
	LogDir string
	// Stdin keeps a pipe open on the container's stdin.
	Stdin bool
	// StdinOnce closes the container's stdin when the first attach with
	// stdin ends.
	StdinOnce bool
	// TTY gives the container a pty; its output is logged as stdout.
	TTY bool
	// Restore (CreateRestored only): the container is restored from a
	// checkpoint rather than started: the create spawns nothing, and
	// Start has CRIU restore its processes from these folders.
	Restore *RestoreRequest `json:",omitempty"`
}

// RestoreRequest names a checkpoint's CRIU images and the folder CRIU works
// (and logs) in.
type RestoreRequest struct {
	ImagesDir, WorkDir string
}

// KillRequest signals a container's init, or every process in its cgroup.
type KillRequest struct {
	ID     string
	Signal int
	All    bool
}

// WaitRequest blocks until the container stops, or Timeout (0: no limit)
// passes, in which case the reply's Status is not StatusStopped.
type WaitRequest struct {
	ID      string
	Timeout time.Duration
}

// UpdateRequest changes a created or running container's cgroup limits.
// Device rules stay as the container was created with.
type UpdateRequest struct {
	ID        string
	Resources *specs.LinuxResources
}

// CheckpointRequest has CRIU checkpoint a running container, which runs on
// afterwards.
type CheckpointRequest struct {
	ID string
	// ImagesDir receives CRIU's images; WorkDir its log (dump.log) and
	// statistics (stats-dump). Both are made if missing.
	ImagesDir string
	WorkDir   string
	// Timeout stops the checkpoint when it passes (the container is
	// thawed and runs on); 0: none.
	Timeout time.Duration
}

// User is a numeric process identity.
type User struct {
	UID            uint32
	GID            uint32
	AdditionalGids []uint32
}

// ExecRequest runs a command in a running container and captures its output.
type ExecRequest struct {
	ID   string
	Args []string
	// Env, Cwd and User default to the container's own (from its spec).
	Env  []string
	Cwd  string
	User *User
	// Timeout kills the command (and what it spawned) when it passes; 0: none.
	Timeout time.Duration
	// MaxOutput caps stdout+stderr; output beyond it is discarded. 0
	// means DefaultMaxOutput.
	MaxOutput int
	// Token names the exec for CancelExec; set by the client.
	Token string
}

// CancelRequest names an exec whose caller has gone.
type CancelRequest struct {
	Token string
}

// ExecResponse is the outcome of an Exec.
type ExecResponse struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
	TimedOut bool
}

// State describes one container.
type State struct {
	ID     string
	Status string
	Pid    int
	// ExitCode is 128+N when the process was killed by signal N.
	ExitCode   int
	Signal     int
	OOMKilled  bool
	StartedAt  time.Time
	FinishedAt time.Time
}

// Event kinds: what happened to a container in the shim. A reply that
// starts over (EventsReply.Snapshot) has one EventState per container.
const (
	EventCreated = "created"
	EventStarted = "started"
	EventExited  = "exited"
	EventDeleted = "deleted"
	EventState   = "state"
)

// Event is one change of a container, with its state after it.
type Event struct {
	Kind  string
	State State
}

// EventsRequest asks for the events after sequence number After; 0 asks
// for the state of every container.
type EventsRequest struct {
	After uint64
}

// EventsReply answers an EventsRequest once there is something to say.
type EventsReply struct {
	Events []Event
	// Seq is the sequence number of the last event: the next request's After.
	Seq uint64
	// Snapshot: Events are the state of every container, not changes (asked
	// for, or the shim no longer has every event after After).
	Snapshot bool
	// Quit: the shim is shutting down; nothing follows.
	Quit bool
}

// Info describes the shim process itself.
type Info struct {
	Pid     int
	PodDir  string
	Running int // containers in created or running state
}
