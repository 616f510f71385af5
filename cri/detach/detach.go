// Package detach starts the helpers berthd leaves running when it stops (a
// pod's shim, the lazy layer server): each in its own session, so that
// SIGKILL of berthd, or of its process group, leaves it serving, and each
// saying on a pipe when it serves, so that its starter waits for that, not
// for a socket to appear.
//
// A helper is one process start: it stays its starter's child, reaped
// here when it exits, and is reparented to init only if the starter dies
// first. (A double fork through an intermediate cost a second start of
// the binary on every pod start.)
//
// It is a leaf package, a foundation beside cri/errkind: every layer may
// import it, it imports nothing of berth.
package detach

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Command is a helper to start.
type Command struct {
	Argv []string
	Env  []string // its environment; Start adds ReadyEnv
	// ReadyEnv names, in its environment, the fd of the ready pipe (3),
	// on which it writes "ok\n" once it serves (Ready).
	ReadyEnv string
	// Files are more open files it inherits, as fds 4 on.
	Files []*os.File
	// Log takes its stdout and stderr, appended; its end is in the error
	// of a start that fails.
	Log string
}

// FirstFileFd is the fd of Command.Files[0] in the helper.
const FirstFileFd = 4

// ReadyTimeout bounds Start's wait when ctx has no deadline. A helper is
// ready in milliseconds; the bound is for a node so loaded that 50 pods
// starting at once took over 10 s (seen under emulation), where failing
// the start only makes the kubelet ask again. The kubelet's own calls
// carry their deadline (2 minutes by default).
const ReadyTimeout = 30 * time.Second

// Child is a started helper.
type Child struct{ pid int }

// Start starts c detached and waits until it says it serves, or ctx is
// done. One that is not ready then is killed: it would come up later,
// serving something its starter has given up on.
func Start(ctx context.Context, c Command) (Child, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ReadyTimeout)
		defer cancel()
	}
	logf, err := os.OpenFile(c.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return Child{}, err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return Child{}, err
	}
	defer r.Close()
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env = append(slices.Clip(c.Env), c.ReadyEnv+"=3")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = append([]*os.File{w}, c.Files...) // fds 3, 4, …
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	pid, err := startChild(cmd)
	w.Close() // only the child holds the write end now: EOF if it dies
	if err != nil {
		return Child{}, fmt.Errorf("start %s: %w", c.Argv[0], err)
	}
	child := Child{pid}
	if err := waitReady(ctx, r); err != nil {
		child.Kill()
		return Child{}, fmt.Errorf("%w%s", err, logTail(c.Log))
	}
	return child, nil
}

// waitReady waits for "ok\n" on r, the read end of the pipe whose write
// end only the child holds, until ctx is done.
func waitReady(ctx context.Context, r *os.File) error {
	stop := context.AfterFunc(ctx, func() { r.SetReadDeadline(time.Now()) })
	defer stop()
	line, err := bufio.NewReader(r).ReadString('\n')
	if line == readyLine {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("not ready: %w", ctx.Err())
	}
	return errors.New("exited before serving")
}

const readyLine = "ok\n"

// logTail gives the end of the log for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return "; " + filepath.Base(path) + ": " + strings.TrimSpace(string(b))
}

// ReadyPipe is, in the helper, the pipe its starter waits on, named by
// env (Command.ReadyEnv); nil if there is none. env is removed from the
// environment and the pipe is not passed on to the processes it starts.
func ReadyPipe(env string) *os.File {
	v := os.Getenv(env)
	os.Unsetenv(env)
	fd, err := strconv.Atoi(v)
	if v == "" || err != nil {
		return nil
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "ready")
}

// Ready tells the starter, through ReadyPipe's pipe (nil: none), that the
// helper serves.
func Ready(pipe *os.File) {
	if pipe == nil {
		return
	}
	pipe.WriteString(readyLine)
	pipe.Close()
}
