package spec

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultPath is the PATH a container gets when neither the image nor the CRI
// config sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// buildProcess fills args, env, cwd and terminal; the user, capabilities and
// the rest of the security settings are filled by Generate.
func buildProcess(in Input) (*specs.Process, error) {
	args, err := processArgs(in.Config, in.Image.Entrypoint, in.Image.Cmd)
	if err != nil {
		return nil, err
	}
	cwd := in.Config.GetWorkingDir()
	field := "working_dir"
	if cwd == "" {
		cwd, field = in.Image.WorkingDir, "image WorkingDir"
	}
	if cwd == "" {
		cwd = "/"
	}
	if !path.IsAbs(cwd) {
		return nil, fmt.Errorf("%s %q must be an absolute path", field, cwd)
	}
	hostname := in.Pod.GetHostname()
	if hostname == "" && in.HostNet {
		hostname, _ = hostHostname()
	}
	return &specs.Process{
		Terminal: in.Config.GetTty(),
		Args:     args,
		Env:      buildEnv(in.Image.Env, hostname, in.Config.GetEnvs()),
		Cwd:      path.Clean(cwd),
	}, nil
}

// processArgs applies the Kubernetes rules: command given → command + args
// (the image's Entrypoint and Cmd are ignored); only args → image Entrypoint +
// args; neither → image Entrypoint + Cmd.
func processArgs(cfg *runtimeapi.ContainerConfig, entrypoint, cmd []string) ([]string, error) {
	var args []string
	switch {
	case len(cfg.GetCommand()) > 0:
		args = append(append(args, cfg.GetCommand()...), cfg.GetArgs()...)
	case len(cfg.GetArgs()) > 0:
		args = append(append(args, entrypoint...), cfg.GetArgs()...)
	default:
		args = append(append(args, entrypoint...), cmd...)
	}
	if len(args) == 0 {
		return nil, errors.New("no command specified")
	}
	return args, nil
}

// buildEnv merges, by key and keeping the order of first appearance, the
// image's Env, HOSTNAME (the pod's hostname) and the CRI envs, later ones
// winning; PATH gets DefaultPath when nobody set it.
func buildEnv(imageEnv []string, hostname string, criEnv []*runtimeapi.KeyValue) []string {
	var env []string
	index := map[string]int{}
	set := func(kv string) {
		key, _, _ := strings.Cut(kv, "=")
		if key == "" {
			return
		}
		if i, ok := index[key]; ok {
			env[i] = kv
			return
		}
		index[key] = len(env)
		env = append(env, kv)
	}
	for _, kv := range imageEnv {
		set(kv)
	}
	if hostname != "" {
		set("HOSTNAME=" + hostname)
	}
	for _, kv := range criEnv {
		set(kv.GetKey() + "=" + string(kv.GetValue()))
	}
	if _, ok := index["PATH"]; !ok {
		set("PATH=" + DefaultPath)
	}
	return env
}

// Linux real-time signal range as glibc reports it (SIGRTMIN is 34 because
// glibc keeps 32 and 33 for itself).
const (
	sigRTMin = 34
	sigRTMax = 64
)

var signalNames = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "BUS": syscall.SIGBUS,
	"CHLD": syscall.SIGCHLD, "CLD": syscall.SIGCHLD, "CONT": syscall.SIGCONT,
	"FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP, "ILL": syscall.SIGILL,
	"INT": syscall.SIGINT, "IO": syscall.SIGIO, "IOT": syscall.SIGIOT,
	"KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE, "POLL": syscall.SIGPOLL,
	"PROF": syscall.SIGPROF, "PWR": syscall.SIGPWR, "QUIT": syscall.SIGQUIT,
	"SEGV": syscall.SIGSEGV, "STKFLT": syscall.SIGSTKFLT, "STOP": syscall.SIGSTOP,
	"SYS": syscall.SIGSYS, "TERM": syscall.SIGTERM, "TRAP": syscall.SIGTRAP,
	"TSTP": syscall.SIGTSTP, "TTIN": syscall.SIGTTIN, "TTOU": syscall.SIGTTOU,
	"URG": syscall.SIGURG, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"VTALRM": syscall.SIGVTALRM, "WINCH": syscall.SIGWINCH, "XCPU": syscall.SIGXCPU,
	"XFSZ":  syscall.SIGXFSZ,
	"RTMIN": sigRTMin, "RTMAX": sigRTMax,
}

// StopSignal parses an image's StopSignal: a name with or without "SIG"
// ("SIGQUIT", "quit"), "RTMIN+n" / "RTMAX-n", or a number ("3"). "" is
// SIGTERM.
func StopSignal(s string) (syscall.Signal, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return syscall.SIGTERM, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > sigRTMax {
			return 0, fmt.Errorf("invalid stop signal %q: out of range", s)
		}
		return syscall.Signal(n), nil
	}
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if sig, ok := signalNames[name]; ok {
		return sig, nil
	}
	for _, rt := range []struct {
		prefix string
		base   int
		sign   int
	}{{"RTMIN+", sigRTMin, 1}, {"RTMAX-", sigRTMax, -1}} {
		if rest, ok := strings.CutPrefix(name, rt.prefix); ok {
			n, err := strconv.Atoi(rest)
			if err != nil || n < 0 || n > sigRTMax-sigRTMin {
				break
			}
			return syscall.Signal(rt.base + rt.sign*n), nil
		}
	}
	return 0, fmt.Errorf("invalid stop signal %q", s)
}
