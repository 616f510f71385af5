package ops

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/moby/sys/capability"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// saveExecInit writes, into the bundle, what berth-exec-init needs to start
// a process in the container with the confinement of its own process:
// shim.ExecInitFile (the settings, see cmd/berth-exec-init) and, when it
// has one, shim.SeccompFile: the seccomp filter that libcontainer's init
// loaded into the container's process, read back from the kernel while that
// process waits at its exec fifo. Reading it back, rather than compiling the
// profile again, gives every exec the very program the container runs under
// (libcontainer's own compiler and its -ENOSYS stub included) and costs no
// compile per exec. An error leaves neither file: the container's execs go
// through libcontainer, as for one an earlier shim created.
func saveExecInit(id, bundle string, cfg *configs.Config, p *libcontainer.Process, cgroupPaths map[string]string, initPid int) (err error) {
	settings := filepath.Join(bundle, shim.ExecInitFile)
	filter := filepath.Join(bundle, shim.SeccompFile)
	defer func() {
		if err != nil {
			os.Remove(settings)
			os.Remove(filter)
		}
	}()
	s, err := execInitSettings(id, cfg, p, cgroupPaths)
	if err != nil {
		return err
	}
	if cfg.Seccomp != nil {
		prog, err := loadedFilter(initPid)
		if err != nil {
			return fmt.Errorf("seccomp filter of %d: %w", initPid, err)
		}
		if err := os.WriteFile(filter, prog, 0o600); err != nil {
			return err
		}
		flags, err := seccompFlags(cfg.Seccomp)
		if err != nil {
			return err
		}
		s.Add("seccomp", filter)
		s.Add("seccomp_flags", strconv.FormatUint(uint64(flags), 10))
	}
	b, err := s.Bytes()
	if err != nil {
		return err
	}
	return os.WriteFile(settings, b, 0o600)
}

// execInitSettings are the container's process settings as berth-exec-init
// reads them, less the command (the shim adds it, with what an exec request
// changes). What the exec init does not apply is refused here, so that such
// a container execs through libcontainer rather than without it.
func execInitSettings(id string, cfg *configs.Config, p *libcontainer.Process, cgroupPaths map[string]string) (*shim.Settings, error) {
	switch {
	case p.Label != "" || cfg.ProcessLabel != "":
		return nil, errors.New("exec init: no SELinux labels")
	case cfg.Personality != nil || cfg.MemoryPolicy != nil || cfg.Scheduler != nil || cfg.IOPriority != nil:
		return nil, errors.New("exec init: no personality, memory policy, scheduler or I/O priority")
	case cfg.Seccomp != nil && cfg.Seccomp.ListenerPath != "":
		return nil, errors.New("exec init: no seccomp notify")
	case len(cgroupPaths) == 0:
		return nil, errors.New("exec init: the container's cgroups are unknown")
	}
	if cfg.Seccomp != nil {
		for _, c := range cfg.Seccomp.Syscalls {
			if c.Action == configs.Notify {
				return nil, errors.New("exec init: no seccomp notify")
			}
		}
	}
	s := &shim.Settings{}
	add := s.Add
	add("uid", strconv.Itoa(p.UID))
	add("gid", strconv.Itoa(p.GID))
	for _, g := range p.AdditionalGroups {
		add("group", strconv.Itoa(g))
	}
	caps := cfg.Capabilities
	if caps == nil {
		caps = &configs.Capabilities{} // none, as libcontainer's exec
	}
	for _, set := range []struct {
		key   string
		names []string
	}{{"cap_bnd", caps.Bounding}, {"cap_eff", caps.Effective}, {"cap_prm", caps.Permitted},
		{"cap_inh", caps.Inheritable}, {"cap_amb", caps.Ambient}} {
		m, err := capMask(set.names)
		if err != nil {
			return nil, err
		}
		add(set.key, strconv.FormatUint(m, 16))
	}
	if cfg.NoNewPrivileges {
		add("nnp", "1")
	}
	for _, r := range p.Rlimits {
		add("rlimit", fmt.Sprintf("%d %s %s", r.Type, rlimitValue(r.Soft), rlimitValue(r.Hard)))
	}
	if p.AppArmorProfile != "" {
		add("apparmor", p.AppArmorProfile)
	}
	if !cfg.NoNewKeyring {
		add("keyring", "_ses."+id) // the name libcontainer's exec joins
	}
	if p.Cwd != "" {
		add("cwd", p.Cwd)
	}
	if cfg.Umask != nil {
		add("umask", strconv.FormatUint(uint64(*cfg.Umask), 10))
	}
	if cfg.OomScoreAdj != nil {
		add("oom_score_adj", strconv.Itoa(*cfg.OomScoreAdj))
	}
	dirs := map[string]bool{}
	for _, d := range cgroupPaths {
		dirs[d] = true // cgroup v1 controllers mounted together share a folder
	}
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		add("cgroup", d)
	}
	for _, e := range p.Env {
		add("env", e)
	}
	return s, nil
}

// capBits maps capability names ("CAP_CHOWN") to their numbers.
var capBits = func() map[string]uint {
	m := map[string]uint{}
	for _, c := range capability.ListKnown() {
		m["CAP_"+strings.ToUpper(c.String())] = uint(c)
	}
	return m
}()

func capMask(names []string) (uint64, error) {
	var m uint64
	for _, n := range names {
		bit, ok := capBits[n]
		if !ok || bit > 63 {
			return 0, fmt.Errorf("exec init: unknown capability %s", n)
		}
		m |= 1 << bit
	}
	return m, nil
}

func rlimitValue(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "max"
	}
	return strconv.FormatUint(v, 10)
}

// seccompFlags are the SECCOMP_FILTER_FLAG_* bits the profile asks for,
// as libcontainer loads it with (the kernel keeps them with the task, not
// the filter, so they cannot be read back).
func seccompFlags(s *configs.Seccomp) (uint, error) {
	var flags uint
	for _, f := range s.Flags {
		switch f {
		case "SECCOMP_FILTER_FLAG_LOG":
			flags |= unix.SECCOMP_FILTER_FLAG_LOG
		case "SECCOMP_FILTER_FLAG_SPEC_ALLOW":
			flags |= unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
		default:
			return 0, fmt.Errorf("exec init: seccomp flag %s", f)
		}
	}
	return flags, nil
}

// ptraceSeccompGetFilter is PTRACE_SECCOMP_GET_FILTER (linux/ptrace.h).
const ptraceSeccompGetFilter = 0x420c

// loadedFilter reads the seccomp filter (struct sock_filter instructions)
// the thread of pid that runs under one loaded last. libcontainer's init
// loads it on one thread (no TSYNC), the one that then waits at the exec
// fifo, so the thread is found by its status. The thread is attached,
// stopped for the read and let go: its blocked open of the fifo restarts.
func loadedFilter(pid int) ([]byte, error) {
	tid, err := seccompThread(pid)
	if err != nil {
		return nil, err
	}
	// Every ptrace request must come from the thread that attached.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		return nil, fmt.Errorf("attach: %w", err)
	}
	defer unix.PtraceDetach(tid)
	if err := unix.PtraceInterrupt(tid); err != nil {
		return nil, fmt.Errorf("interrupt: %w", err)
	}
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(tid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("wait: %w", err)
		}
		break
	}
	if !ws.Stopped() {
		return nil, errors.New("the process ended")
	}
	n, err := getFilter(tid, nil)
	if err != nil {
		return nil, err
	}
	prog := make([]unix.SockFilter, n)
	if _, err := getFilter(tid, prog); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), n*int(unsafe.Sizeof(prog[0]))), nil
}

// getFilter copies the filter into prog (nil: only its length).
func getFilter(tid int, prog []unix.SockFilter) (int, error) {
	var p unsafe.Pointer
	if prog != nil {
		p = unsafe.Pointer(&prog[0])
	}
	n, _, errno := unix.Syscall6(unix.SYS_PTRACE, ptraceSeccompGetFilter, uintptr(tid), 0, uintptr(p), 0, 0)
	if errno != 0 {
		return 0, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER: %w", errno)
	}
	if n == 0 || (prog != nil && int(n) != len(prog)) {
		return 0, errors.New("PTRACE_SECCOMP_GET_FILTER: the filter changed")
	}
	return int(n), nil
}

// seccompThread is the thread of pid under the most seccomp filters: the
// one that loaded the container's (or one it started since, which shares
// them). Threads under fewer hold only what the process inherited, which
// must never be taken for the container's filter. PTRACE_SECCOMP_GET_FILTER
// gives one filter, the last loaded, so the thread must be under exactly
// one more than this process (whose filters it and every exec init inherit
// from the shim alike): more stacked filters would leave an exec less
// confined than the container.
func seccompThread(pid int) (int, error) {
	own, err := seccompFilters("/proc/thread-self/status")
	if err != nil {
		return 0, err
	}
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	tid, most := 0, 0
	for _, t := range tasks {
		n, err := seccompFilters(filepath.Join(dir, t.Name(), "status"))
		if err != nil || n <= most {
			continue
		}
		if tid, err = strconv.Atoi(t.Name()); err != nil {
			return 0, err
		}
		most = n
	}
	if most != own+1 {
		return 0, fmt.Errorf("a thread under %d seccomp filters, this process under %d: not the one filter an exec init carries", most, own)
	}
	return tid, nil
}

// seccompFilters is the Seccomp_filters count of a /proc status file.
func seccompFilters(status string) (int, error) {
	b, err := os.ReadFile(status)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Seccomp_filters:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("%s: no Seccomp_filters", status)
}
