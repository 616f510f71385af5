package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/sandbox/store"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// pauseID names the pause container inside its pod's shim.
const pauseID = "pause"

// pauseConfinement is the user, seccomp filter and AppArmor profile the
// pod's security context asks for its sandbox: they apply to the pause.
type pauseConfinement struct {
	user     specs.User
	seccomp  *specs.LinuxSeccomp
	apparmor string
}

// pauseConfinementOf resolves the pod's user, seccomp and AppArmor fields
// (for every pod, so that a bad one is refused whether or not the pod has a
// pause process). userNS is the pod's own user namespace as podUserNS
// checked it, nil for the host's.
func (m *Manager) pauseConfinementOf(cfg *runtimeapi.PodSandboxConfig, userNS *runtimeapi.UserNamespace) (pauseConfinement, error) {
	sc := cfg.GetLinux().GetSecurityContext()
	uids, gids := uint32(math.MaxUint32), uint32(math.MaxUint32) // the host's user namespace maps them all
	if userNS != nil {
		uids, gids = userNS.Uids[0].Length, userNS.Gids[0].Length
	}
	user, err := spec.PauseUser(sc, uids, gids)
	if err != nil {
		return pauseConfinement{}, errkind.Errorf(errkind.Invalid, "%v", err)
	}
	filter, err := spec.PauseSeccomp(sc)
	if err != nil {
		return pauseConfinement{}, errkind.Errorf(errkind.Invalid, "linux.security_context: %v", err)
	}
	profile, err := spec.PauseAppArmor(sc, m.apparmor)
	if err != nil {
		return pauseConfinement{}, errkind.Errorf(errkind.Invalid, "linux.security_context: %v", err)
	}
	return pauseConfinement{user: user, seccomp: filter, apparmor: profile}, nil
}

// startPause runs the built-in pause (berth-pause, a static C program) as
// PID 1 of the pod's shared PID namespace, in an empty read-only rootfs
// holding only that binary, and returns its host PID. Root in the pod's
// containers may trace or signal its PID 1, so the pause holds nothing
// worth taking: it runs as an unprivileged user (conf.user) with no
// capabilities at all and no_new_privs, and berth-pause makes itself
// non-dumpable (which the kernel resets at each exec, so only the program
// itself can set it): a container process with the pause's uid but
// without CAP_SYS_PTRACE can neither trace it nor read its memory.
func (m *Manager) startPause(ctx context.Context, pod *store.Pod, client *shim.Client, conf pauseConfinement) (int, error) {
	bundle := shim.ContainerDir(m.podDir(pod.ID), pauseID)
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		return 0, err
	}
	// In a user namespace the pause's init makes its mount points (/dev,
	// /pause) as the pod's root: the empty rootfs is that root's.
	if u := namespaceOptions(pod.Config).GetUsernsOptions(); pod.Pins[string(podns.User)] != "" {
		if err := os.Lchown(filepath.Join(bundle, "rootfs"), int(u.Uids[0].HostId), int(u.Gids[0].HostId)); err != nil {
			return 0, err
		}
	}
	if err := writeJSON(filepath.Join(bundle, "config.json"), m.pauseSpec(pod, conf)); err != nil {
		return 0, err
	}
	if err := client.Create(ctx, shim.CreateRequest{ID: pauseID, Bundle: bundle}); err != nil {
		return 0, err
	}
	st, err := client.Start(ctx, pauseID)
	if err == nil {
		err = waitPauseSettled(ctx, st.Pid)
	}
	if err != nil {
		client.Kill(ctx, pauseID, syscall.SIGKILL, true)
		client.Delete(ctx, pauseID)
		return 0, err
	}
	return st.Pid, nil
}

// pauseIgnores is the signal mask berth-pause ignores once it has made
// itself non-dumpable: every signal but SIGKILL and SIGSTOP.
const pauseIgnores = ^uint64(0) &^ (1<<(syscall.SIGKILL-1) | 1<<(syscall.SIGSTOP-1))

// waitPauseSettled waits until the pause has made itself non-dumpable,
// which it does first thing, then ignores every signal (/proc's SigIgn
// shows it). Start returns once the pause's init has been let go to exec
// it; on a loaded node the program may not have run for a while, and no
// container of the pod may start while the pause can still be traced.
func waitPauseSettled(ctx context.Context, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ign, exited, err := pauseSignals(pid)
		if err != nil {
			return fmt.Errorf("pause %d: %w", pid, err)
		}
		if exited {
			return fmt.Errorf("pause %d exited as it started (see the pod's shim.log)", pid)
		}
		if ign == pauseIgnores {
			return nil
		}
		select {
		case <-ctx.Done():
			return errkind.Errorf(errkind.DeadlineExceeded, "pause %d did not settle (ignored signals %#x): %v", pid, ign, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// pauseSignals reads from /proc a process's ignored-signal mask, and
// whether it has exited (a zombie, not yet reaped by its shim).
func pauseSignals(pid int) (ignored uint64, exited bool, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false, err
	}
	field := func(name string) string {
		_, rest, _ := strings.Cut(string(b), "\n"+name+":")
		v, _, _ := strings.Cut(strings.TrimSpace(rest), "\n")
		return v
	}
	if strings.HasPrefix(field("State"), "Z") {
		return 0, true, nil
	}
	ignored, err = strconv.ParseUint(field("SigIgn"), 16, 64)
	if err != nil {
		return 0, false, errors.New("no SigIgn in its status")
	}
	return ignored, false, nil
}

func (m *Manager) pauseSpec(pod *store.Pod, conf pauseConfinement) *specs.Spec {
	nss := []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}}
	for kind, typ := range map[string]specs.LinuxNamespaceType{"net": specs.NetworkNamespace, "ipc": specs.IPCNamespace, "uts": specs.UTSNamespace} {
		if pin := pod.Pins[kind]; pin != "" {
			nss = append(nss, specs.LinuxNamespace{Type: typ, Path: pin})
		}
	}
	s := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			Args: []string{"/pause"}, Cwd: "/", NoNewPrivileges: true,
			Env: []string{"PATH=/"}, ApparmorProfile: conf.apparmor,
			User: conf.user,
			// Every set empty, the bounding set too (nil would keep the
			// shim's, every capability).
			Capabilities: &specs.LinuxCapabilities{},
		},
		Mounts: []specs.Mount{
			{Destination: "/pause", Type: "bind", Source: m.opts.PauseBinary, Options: []string{"rbind", "ro"}},
			// libcontainer's init needs /proc of the rootfs after the
			// pivot: to drop the capabilities (cap_last_cap), to reach its
			// file descriptors (/proc/self/fd, the masks below among them)
			// and, in a user namespace, to set up the user.
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		},
		Linux: &specs.Linux{
			Namespaces:  nss,
			CgroupsPath: m.pauseCgroup(pod),
			Seccomp:     conf.seccomp,
			// That /proc is masked as a default container's: root in a
			// container of the pod given CAP_SYS_PTRACE reaches it through
			// /proc/1/root, where an unmasked /proc/sys would let it write
			// the host's kernel.core_pattern.
			MaskedPaths:   slices.Clone(spec.DefaultMaskedPaths),
			ReadonlyPaths: slices.Clone(spec.DefaultReadonlyPaths),
		},
	}
	joinUserNS(s, pod)
	return s
}

// joinUserNS puts the pause of s in the pod's user namespace, if it has
// one.
func joinUserNS(s *specs.Spec, pod *store.Pod) {
	if pin := pod.Pins[string(podns.User)]; pin != "" {
		u := namespaceOptions(pod.Config).GetUsernsOptions()
		spec.JoinUserNS(s, pin, specIDMap(u.Uids[0]), specIDMap(u.Gids[0]))
	}
}

// pauseCgroup is the pause's cgroup, named after the pod: the attempts of a
// kubelet pod share its pod cgroup, and may overlap (one stopped, not yet
// removed, the next running).
func (m *Manager) pauseCgroup(pod *store.Pod) string {
	return m.opts.Cgroups.ContainerCgroupsPath(pod.Cgroup, pod.ID)
}

// pinPIDNamespace pins the pause's PID namespace with the pod's other
// pins: containers join the pin, which names that namespace for as long as
// the pod has it, never another process's after PID reuse.
func (m *Manager) pinPIDNamespace(pod *store.Pod) error {
	p, err := podns.PinProcess(m.nsDir(pod.ID), podns.PID, pod.PausePID)
	if err != nil {
		return err
	}
	pod.Pins[string(podns.PID)] = p
	return nil
}

// pidNamespace is the namespace containers of a shared-PID pod join: its
// pin, or for a pod made before pins of the PID namespace, the pause's.
func pidNamespace(pod *store.Pod) string {
	if p := pod.Pins[string(podns.PID)]; p != "" {
		return p
	}
	return fmt.Sprintf("/proc/%d/ns/pid", pod.PausePID)
}

// pauseExited handles the exit of the pod's pause, which ends every
// process of the pod's PID namespace: a pod whose pause exits while berthd
// counts on it turns NOTREADY, and the kubelet recreates it. A shim that
// goes away is followShim's to report.
func (m *Manager) pauseExited(podID string, c *shim.Client, st shim.State) {
	unlock := m.pods.lock(podID) // a stop in progress finishes first
	defer unlock()
	pod, err := m.GetPod(podID)
	if err != nil || pod.State != runtimeapi.PodSandboxState_SANDBOX_READY || m.shim(podID) != c {
		return
	}
	m.log.Warn("pause process exited: pod is not ready", "pod", podID, "exit", st.ExitCode, "signal", st.Signal)
	if err := m.podNotReady(pod); err != nil {
		m.log.Error("record pod not ready", "pod", podID, "err", err)
	}
}

// checkPause refuses to add a container to a pod whose pause is gone,
// before watchPause has noticed.
func (m *Manager) checkPause(ctx context.Context, pod *store.Pod) error {
	if pod.PausePID == 0 {
		return nil
	}
	client, err := m.podShim(pod.ID)
	if err != nil {
		return errkind.Errorf(errkind.FailedPrecondition, "pod %s is not ready: %v", pod.ID, err)
	}
	st, err := client.State(ctx, pauseID)
	if err != nil || st.Status != shim.StatusRunning {
		return errkind.Errorf(errkind.FailedPrecondition, "pod %s is not ready: its pause process (PID 1 of the pod) is gone (%s, %v)", pod.ID, st.Status, err)
	}
	return nil
}

// killPause stops the pause process; a pod whose shim is gone has none left
// to stop.
func (m *Manager) killPause(ctx context.Context, podID string) error {
	client, err := m.podShim(podID)
	if err != nil {
		return nil
	}
	if err := client.Kill(ctx, pauseID, syscall.SIGKILL, true); err != nil && !shim.IsNotFound(err) && !errors.Is(err, shim.ErrUnavailable) {
		return fmt.Errorf("kill pause: %w", err)
	}
	_, err = waitStopped(ctx, client, pauseID, 10*time.Second)
	if errors.Is(err, shim.ErrUnavailable) || shim.IsNotFound(err) {
		return nil
	}
	return err
}
