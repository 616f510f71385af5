package shim

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/cri/readyfd"
)

// ReadyFdEnv names the fd on which the shim writes "ok\n" once its socket
// is listening; it is closed without that on failure.
const ReadyFdEnv = "_BERTH_SHIM_READY_FD"

// startTimeout bounds Start when ctx has no deadline. A shim is ready in
// milliseconds; the bound is for a node so loaded that 50 pods starting at
// once took over 10 s (seen under emulation), where failing the pod only
// makes the kubelet start it again. The kubelet's own calls carry their
// deadline (2 minutes by default).
const startTimeout = 30 * time.Second

// Start starts the shim for podDir, detached (its own session, so SIGKILL
// of berthd, or of its process group, leaves it running), waits until it
// serves and returns a client. A shim already serving podDir is reused.
//
// The shim is one process start: it stays the caller's child, reaped by
// reapShims when it exits, and is reparented to init only if the caller
// dies first. (A double fork through an intermediate shim process cost a
// second start of the 10 MB binary on every pod start.)
func Start(ctx context.Context, binary, podDir string) (*Client, error) {
	if err := os.MkdirAll(podDir, 0o700); err != nil {
		return nil, err
	}
	if c, err := Dial(podDir); err == nil {
		if _, err := c.Info(ctx); err == nil {
			return c, nil
		}
		c.Close()
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	logPath := filepath.Join(podDir, LogFile)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()

	execInit, err := SealedExecInit(filepath.Join(filepath.Dir(binary), ExecInitBinary))
	if err != nil {
		w.Close()
		return nil, err
	}
	cmd := exec.Command(binary, "serve", "--dir", podDir)
	cmd.Env = append(shimEnv(os.Environ()), ReadyFdEnv+"=3", ExecInitFdEnv+"=4")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{w, execInit} // fds 3 and 4 in the shim
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	pid, err := startChild(cmd)
	w.Close() // only the shim holds the write end now: EOF if it dies
	if err != nil {
		return nil, fmt.Errorf("start shim: %w", err)
	}
	if err := readyfd.Wait(ctx, r); err != nil {
		// One that is only slow would come up later, serving a pod folder
		// the caller is about to remove: kill it.
		killChild(pid)
		return nil, fmt.Errorf("shim for %s: %w%s", podDir, err, logTail(logPath))
	}
	c, err := Dial(podDir)
	if err != nil {
		killChild(pid)
		return nil, err
	}
	return c, nil
}

// logTail gives the end of shim.log for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return "; shim.log: " + strings.TrimSpace(string(b))
}

// shimEnv is the environment a shim runs with: the daemon's, with Go
// runtime settings for a process that waits most of its life. They are set
// in the environment, not by the shim itself, because the runtime reads
// them before main runs, and libcontainer passes them on to every
// container's and exec's init (the same binary).
func shimEnv(env []string) []string {
	if os.Getenv("GOMAXPROCS") == "" {
		// One P: the shim waits on syscalls and pipes, and each P costs its
		// caches and threads. (The runtime still finds its CPU cgroup in
		// /proc/self/mountinfo at start, GOMAXPROCS set or not: Go 1.25+.)
		env = append(env, "GOMAXPROCS=1")
	}
	// No transparent huge pages for the heap: on kernels that default to
	// them (Debian's), a shim's few MiB of heap round up to 2 MiB pages,
	// about 2 MiB more per pod. Added to an operator's GODEBUG, which wins
	// where it sets disablethp itself.
	return withGODEBUG(env, "disablethp", "1")
}

// withGODEBUG sets key=value in env's GODEBUG, keeping the settings already
// there; a key already set keeps its value.
func withGODEBUG(env []string, key, value string) []string {
	const name = "GODEBUG="
	for i, kv := range env {
		if !strings.HasPrefix(kv, name) {
			continue
		}
		settings := strings.TrimPrefix(kv, name)
		for _, s := range strings.Split(settings, ",") {
			if strings.HasPrefix(s, key+"=") {
				return env
			}
		}
		if settings != "" {
			settings += ","
		}
		env = slices.Clone(env)
		env[i] = name + settings + key + "=" + value
		return env
	}
	return append(env, name+key+"="+value)
}
