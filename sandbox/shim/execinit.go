package shim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ExecInitBinary is berth-exec-init's file name, beside the shim's binary:
// the C program that starts an exec'd process in a container (see
// cmd/berth-exec-init).
const ExecInitBinary = "berth-exec-init"

// ExecInitFdEnv names the fd of the sealed copy of berth-exec-init that
// the shim starts execs from (see SealedExecInit).
const ExecInitFdEnv = "_BERTH_EXEC_INIT_FD"

// PidsLimitReport begins berth-exec-init's report of a fork the kernel
// refused with EAGAIN (PIDS_LIMIT_REPORT in cmd/berth-exec-init): the pids
// limit of the container's cgroup is reached.
const PidsLimitReport = "pids limit: "

// Settings are berth-exec-init's settings: "key=value" records, each
// ending in NUL. A value holding a NUL would end its record early and
// could forge the next one, so it is refused.
type Settings struct {
	b   []byte
	err error
}

// Add appends one record.
func (s *Settings) Add(key, value string) {
	if strings.IndexByte(value, 0) >= 0 {
		s.err = fmt.Errorf("exec init: %s holds a NUL byte", key)
		return
	}
	s.b = append(append(append(append(s.b, key...), '='), value...), 0)
}

// Bytes are the records, or the first refusal.
func (s *Settings) Bytes() ([]byte, error) {
	return s.b, s.err
}

// CloneableCgroup is the container's cgroup in its exec init settings when
// it has one and it is a cgroup v2 one, else "": the shim then clones exec
// inits into it (CLONE_INTO_CGROUP) rather than have them move there. A
// move, a write to cgroup.procs, takes the kernel's cgroup_threadgroup_rwsem
// for writing, which waits for an RCU grace period unless another move came
// just before: on a 2-CPU node 10-30 ms for execs seconds apart, as probes
// come, against 0.5 ms back to back (docs/performance.md). cgroup v1 has no
// such clone; there the exec init moves itself.
func CloneableCgroup(settings []byte) string {
	dirs := settingsValues(settings, "cgroup")
	var st unix.Statfs_t
	if len(dirs) != 1 || unix.Statfs(dirs[0], &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return ""
	}
	return dirs[0]
}

// settingsValues are the values of the records of key in settings.
func settingsValues(settings []byte, key string) []string {
	var out []string
	for rec := range bytes.SplitSeq(bytes.TrimSuffix(settings, []byte{0}), []byte{0}) {
		if v, ok := bytes.CutPrefix(rec, []byte(key+"=")); ok {
			out = append(out, string(v))
		}
	}
	return out
}

// ExecSettings are the settings of one exec: the container's (base, as
// saved at create) with what req changes, its command, and a new pty when
// tty. The environment is deduplicated (the last of a name wins) and an
// empty HOME dropped, as libcontainer does; berth-exec-init adds HOME from
// the container's /etc/passwd when none is left. inCgroup leaves out the
// cgroups, for an exec init started in the container's (CLONE_INTO_CGROUP).
func ExecSettings(base []byte, req *ExecRequest, tty, inCgroup bool) ([]byte, error) {
	if len(req.Args) == 0 {
		return nil, errors.New("exec: no command")
	}
	var s Settings
	var env []string
	for rec := range bytes.SplitSeq(bytes.TrimSuffix(base, []byte{0}), []byte{0}) {
		k, v, ok := strings.Cut(string(rec), "=")
		if !ok {
			return nil, fmt.Errorf("exec init settings: bad record %q", rec)
		}
		switch {
		case k == "env":
			env = append(env, v)
			continue
		case k == "cwd" && req.Cwd != "",
			(k == "uid" || k == "gid" || k == "group") && req.User != nil,
			k == "cgroup" && inCgroup:
			continue
		}
		s.Add(k, v)
	}
	if req.Env != nil {
		env = req.Env
	}
	if req.Cwd != "" {
		s.Add("cwd", req.Cwd)
	}
	if u := req.User; u != nil {
		s.Add("uid", strconv.FormatUint(uint64(u.UID), 10))
		s.Add("gid", strconv.FormatUint(uint64(u.GID), 10))
		for _, g := range u.AdditionalGids {
			s.Add("group", strconv.FormatUint(uint64(g), 10))
		}
	}
	env, err := dedupEnv(env)
	if err != nil {
		return nil, err
	}
	for _, e := range env {
		s.Add("env", e)
	}
	for _, a := range req.Args {
		s.Add("arg", a)
	}
	if tty {
		s.Add("tty", "1")
	}
	return s.Bytes()
}

// dedupEnv keeps the last of each name, in the order of the last ones.
func dedupEnv(env []string) ([]string, error) {
	seen := map[string]bool{}
	out := make([]string, 0, len(env))
	for i := len(env) - 1; i >= 0; i-- {
		k, v, ok := strings.Cut(env[i], "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid environment variable %q", env[i])
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		if k == "HOME" && v == "" {
			continue
		}
		out = append(out, env[i])
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

var sealed struct {
	mu    sync.Mutex
	files map[string]*os.File
}

// SealedExecInit is a copy of the berth-exec-init at path in a sealed
// memfd, made once per process (berthd) and handed to every shim it
// starts. The shim starts each exec from it, never from the host's file:
// until the command's execve, /proc/PID/exe of the process in the
// container names the binary it runs, and root in a container could
// reopen it for writing there (CVE-2019-5736). Nothing can write a sealed
// memfd, and one copy serves every pod (a copy per shim would cost each
// pod the binary's size).
func SealedExecInit(path string) (*os.File, error) {
	sealed.mu.Lock()
	defer sealed.mu.Unlock()
	if f := sealed.files[path]; f != nil {
		return f, nil
	}
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s not found beside the shim: %w", ExecInitBinary, err)
	}
	defer src.Close()
	// MFD_EXEC: kernels that know it may refuse to run a memfd made
	// without it (vm.memfd_noexec); older ones refuse the flag.
	fd, err := unix.MemfdCreate(ExecInitBinary, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if err == unix.EINVAL {
		fd, err = unix.MemfdCreate(ExecInitBinary, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd for %s: %w", ExecInitBinary, err)
	}
	f := os.NewFile(uintptr(fd), ExecInitBinary)
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy %s: %w", ExecInitBinary, err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal %s: %w", ExecInitBinary, err)
	}
	if sealed.files == nil {
		sealed.files = map[string]*os.File{}
	}
	sealed.files[path] = f
	return f, nil
}
