package sandbox

import (
	"fmt"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerNSField is the CRI field of a container's namespace requests.
const containerNSField = "config.linux.security_context.namespace_options"

// pidNS is the PID namespace a container's spec asks for: path joined when
// set, else the host's when host, else a new one of its own.
type pidNS struct {
	path string
	host bool
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
// The target is joined by /proc/<its init pid>/ns/pid, read once here, while
// the pod is locked: the path goes into the bundle's config.json, which the
// shim uses at create, so nothing kept later depends on that PID.
func (m *Manager) containerNamespaces(pod *Pod, cfg *runtimeapi.ContainerConfig) (pidNS, error) {
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
		path, err := m.targetPIDNamespace(pod, o.GetTargetId())
		return pidNS{path: path}, err
	}
	return pidNS{}, errkind.Errorf(errkind.Invalid, "%s.pid: unknown mode %v", containerNSField, mode)
}

// targetPIDNamespace is the PID namespace of the running container id of
// pod, as a path to join.
func (m *Manager) targetPIDNamespace(pod *Pod, id string) (string, error) {
	field := containerNSField + ".target_id"
	if id == "" {
		return "", errkind.Errorf(errkind.Invalid, "%s is required with pid mode TARGET", field)
	}
	target, st, err := m.state.container(id)
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: %w", field, err)
	case target.PodID != pod.ID:
		return "", errkind.Errorf(errkind.Invalid, "%s: container %s is in pod %s, not in this pod %s", field, target.ID, target.PodID, pod.ID)
	case st.Status != shim.StatusRunning || st.Pid <= 0:
		return "", errkind.Errorf(errkind.FailedPrecondition, "%s: container %s is %s, not running", field, target.ID, st.Status)
	}
	return fmt.Sprintf("/proc/%d/ns/pid", st.Pid), nil
}
