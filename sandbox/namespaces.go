package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerNSField is the CRI field of a container's namespace requests.
const containerNSField = "config.linux.security_context.namespace_options"

// pidNS is the PID namespace a container's spec asks for: path joined when
// set, else the host's when host, else a new one of its own. target is the
// container whose namespace is to be joined (pid mode TARGET): its pin
// becomes path once the container has a bundle to hold it.
type pidNS struct {
	path   string
	host   bool
	target string
}

// containerNamespaces checks the container's namespace options against its
// pod's and returns the PID namespace it gets. The kubelet repeats the pod's
// modes in every container's options, so equal modes pass; a container
// without options follows its pod. Network and IPC belong to the pod (one
// pinned namespace each), so a different mode is refused. The PID mode is
// the container's own, as containerd has it: CONTAINER a namespace of its
// own, POD the pod's (only a pod of pid mode POD has one), TARGET that of
// another running container of the pod (kubectl debug --target; the
// kubelet sends TARGET in place of CONTAINER, so in pods of pid mode
// CONTAINER). NODE is the pod's choice (hostPID), so it must match.
//
// The target is joined through a pin of its namespace that
// pinTargetPIDNamespace makes for the create, never by its PID: once the
// target exits, the PID may be another process's.
func (m *Manager) containerNamespaces(pod *store.Pod, cfg *runtimeapi.ContainerConfig) (pidNS, error) {
	podNS := namespaceOptions(pod.Config)
	o := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	if o == nil {
		o = podNS
	}
	if o.GetNetwork() != podNS.GetNetwork() {
		return pidNS{}, errkind.Errorf(errkind.Invalid, "%s.network: %v differs from the pod's %v; a pod's containers share its network namespace",
			containerNSField, o.GetNetwork(), podNS.GetNetwork())
	}
	if o.GetIpc() != podNS.GetIpc() {
		return pidNS{}, errkind.Errorf(errkind.Invalid, "%s.ipc: %v differs from the pod's %v; a pod's containers share its IPC namespace",
			containerNSField, o.GetIpc(), podNS.GetIpc())
	}
	mode, podMode := o.GetPid(), podNS.GetPid()
	if (mode == runtimeapi.NamespaceMode_NODE) != (podMode == runtimeapi.NamespaceMode_NODE) {
		return pidNS{}, errkind.Errorf(errkind.Invalid, "%s.pid: %v differs from the pod's %v; the host's PID namespace is the pod's choice",
			containerNSField, mode, podMode)
	}
	switch mode {
	case runtimeapi.NamespaceMode_NODE:
		return pidNS{host: true}, nil
	case runtimeapi.NamespaceMode_CONTAINER:
		return pidNS{}, nil
	case runtimeapi.NamespaceMode_POD:
		if pod.PausePID <= 0 {
			return pidNS{}, errkind.Errorf(errkind.Invalid, "%s.pid: POD, but pod %s has no shared PID namespace (its pid mode is %v)",
				containerNSField, pod.ID, podMode)
		}
		return pidNS{path: pidNamespace(pod)}, nil
	case runtimeapi.NamespaceMode_TARGET:
		target, err := m.checkTarget(pod, o.GetTargetId())
		return pidNS{target: target}, err
	}
	return pidNS{}, errkind.Errorf(errkind.Invalid, "%s.pid: unknown mode %v", containerNSField, mode)
}

// targetField is the CRI field naming a TARGET container.
const targetField = containerNSField + ".target_id"

// checkTarget returns the full ID of container id, which must be running
// in pod.
func (m *Manager) checkTarget(pod *store.Pod, id string) (string, error) {
	if id == "" {
		return "", errkind.Errorf(errkind.Invalid, "%s is required with pid mode TARGET", targetField)
	}
	target, st, err := m.store.Container(id)
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: %w", targetField, err)
	case target.PodID != pod.ID:
		return "", errkind.Errorf(errkind.Invalid, "%s: container %s is in pod %s, not in this pod %s", targetField, target.ID, target.PodID, pod.ID)
	case st.Status != shim.StatusRunning || st.Pid <= 0:
		return "", targetNotRunning(target.ID, st.Status)
	}
	return target.ID, nil
}

func targetNotRunning(id, status string) error {
	return errkind.Errorf(errkind.FailedPrecondition, "%s: container %s is %s, not running", targetField, id, status)
}

// targetPIDPin is the pin of a TARGET container's PID namespace in the
// container's bundle, there from the pin to the shim's create.
const targetPIDPin = "target-pid-ns"

// pinTargetPIDNamespace pins the PID namespace of container target of pod
// at pin, asking the shim (not berthd's record, which may lag an exit) for
// the target's PID.
func (m *Manager) pinTargetPIDNamespace(ctx context.Context, pod *store.Pod, target, pin string) error {
	client, err := m.podShim(pod.ID)
	if err != nil {
		return err
	}
	runningPID := func() (int, error) {
		st, err := client.State(ctx, target)
		if err != nil {
			return 0, fmt.Errorf("%s: container %s: %w", targetField, target, err)
		}
		if st.Status != shim.StatusRunning || st.Pid <= 0 {
			return 0, targetNotRunning(target, st.Status)
		}
		return st.Pid, nil
	}
	pid, err := runningPID()
	if err != nil {
		return err
	}
	err = pinLiveProcessPIDNamespace(pin, pid, func() error {
		again, err := runningPID()
		if err == nil && again != pid {
			err = errProcessGone
		}
		return err
	})
	if errors.Is(err, errProcessGone) {
		// %w: a pin that could not be removed says so too.
		return errkind.Errorf(errkind.FailedPrecondition, "%s: container %s exited: %w", targetField, target, err)
	}
	return err
}

// errProcessGone: the process whose namespace was to be pinned exited.
var errProcessGone = errors.New("its process is gone")

// pinLiveProcessPIDNamespace pins the PID namespace of process pid at pin, once
// confirm has said pid is still the process meant. A PID names a process
// only while it lives: after its exit, another may take it. So a pidfd
// holds the process first, confirm then makes sure it is the one meant, and
// once the namespace is pinned through /proc/<pid> the pidfd's process must
// still be there, or the pin may be of whoever took the PID since, and is
// removed.
func pinLiveProcessPIDNamespace(pin string, pid int, confirm func() error) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH {
		return errProcessGone
	}
	if err != nil {
		return fmt.Errorf("pidfd of process %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	if err := confirm(); err != nil {
		return err
	}
	err = podns.PinProcessAt(pin, podns.PID, pid)
	switch {
	case !alive(pidfd):
		return errors.Join(errProcessGone, podns.RemovePin(pin))
	case err != nil:
		return err
	}
	return nil
}

// alive reports whether the process of pidfd has not exited (or has, but
// is not reaped yet: its PID is not free then either).
func alive(pidfd int) bool { return unix.PidfdSendSignal(pidfd, 0, nil, 0) == nil }
