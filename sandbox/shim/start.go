package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-runtime/berth/cri/detach"
)

// ReadyFdEnv names the fd on which the shim writes "ok\n" once its socket
// is listening; it is closed without that on failure.
const ReadyFdEnv = "_BERTH_SHIM_READY_FD"

// Start starts the shim for podDir, detached (cri/detach: its own
// session, so SIGKILL of berthd, or of its process group, leaves it
// running), waits until it serves and returns a client. A shim already
// serving podDir is reused. A ctx without a deadline waits
// detach.ReadyTimeout at most.
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
	execInit, err := SealedExecInit(filepath.Join(filepath.Dir(binary), ExecInitBinary))
	if err != nil {
		return nil, err
	}
	child, err := detach.Start(ctx, detach.Command{
		Argv:     []string{binary, "serve", "--dir", podDir},
		Env:      append(shimEnv(os.Environ()), ExecInitFdEnv+"="+strconv.Itoa(detach.FirstFileFd)),
		ReadyEnv: ReadyFdEnv,
		Files:    []*os.File{execInit},
		Log:      filepath.Join(podDir, LogFile),
	})
	if err != nil {
		return nil, fmt.Errorf("shim for %s: %w", podDir, err)
	}
	c, err := Dial(podDir)
	if err != nil {
		child.Kill()
		return nil, err
	}
	return c, nil
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
