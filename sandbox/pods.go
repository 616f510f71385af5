package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podfiles"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func validatePodConfig(cfg *runtimeapi.PodSandboxConfig) error {
	md := cfg.GetMetadata()
	switch {
	case md == nil:
		return errkind.Errorf(errkind.Invalid, "config.metadata is required")
	case md.Name == "":
		return errkind.Errorf(errkind.Invalid, "config.metadata.name is required")
	case md.Namespace == "":
		return errkind.Errorf(errkind.Invalid, "config.metadata.namespace is required")
	case md.Uid == "":
		return errkind.Errorf(errkind.Invalid, "config.metadata.uid is required")
	}
	if err := spec.CheckReservedAnnotations("config.annotations", cfg.GetAnnotations()); err != nil {
		return errkind.Errorf(errkind.Invalid, "%v", err)
	}
	return checkLogDirectory(cfg.GetLogDirectory())
}

// checkLogDirectory and checkLogPath confine the CRI log, which the shim
// (root) writes: a pod's log_directory is absolute without .., and a
// container's log_path stays inside it (the kubelet sends NAME/RESTART.log:
// local, but not always one element).
func checkLogDirectory(dir string) error {
	if dir != "" && (!filepath.IsAbs(dir) || slices.Contains(strings.Split(dir, "/"), "..")) {
		return errkind.Errorf(errkind.Invalid, "config.log_directory %q: must be an absolute path without ..", dir)
	}
	return nil
}

func checkLogPath(p string) error {
	if p != "" && (!filepath.IsLocal(p) || filepath.Clean(p) == ".") {
		return errkind.Errorf(errkind.Invalid, "config.log_path %q: must name a file inside the pod's log_directory", p)
	}
	return nil
}

func namespaceOptions(cfg *runtimeapi.PodSandboxConfig) *runtimeapi.NamespaceOption {
	if o := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions(); o != nil {
		return o
	}
	return &runtimeapi.NamespaceOption{}
}

// StopPod kills the pod's containers, stops its shim and releases its
// namespaces; the record stays (NOTREADY) until RemovePod. Stopping an
// unknown or stopped pod is not an error.
func (m *Manager) StopPod(ctx context.Context, id string) error {
	pod, unlock, err := m.lockPod(id)
	if pod == nil {
		return err
	}
	defer unlock()
	return m.stopPodLocked(ctx, pod)
}

// lockPod finds a pod, locks it and reads it again under the lock (another
// call may have changed or removed it meanwhile). A missing pod is nil with
// no error: stop and remove are idempotent.
func (m *Manager) lockPod(id string) (*store.Pod, func(), error) {
	pod, err := m.GetPod(id)
	if err != nil {
		if errors.Is(err, errkind.NotFound) {
			err = nil
		}
		return nil, nil, err
	}
	unlock := m.pods.lock(pod.ID)
	if pod, err = m.GetPod(pod.ID); err != nil {
		unlock()
		if errors.Is(err, errkind.NotFound) {
			err = nil
		}
		return nil, nil, err
	}
	return pod, unlock, nil
}

func (m *Manager) stopPodLocked(ctx context.Context, pod *store.Pod) error {
	ctrs := m.store.ContainersOf(pod.ID)
	ids := []string{pauseID}
	for _, c := range ctrs {
		if err := m.stopContainerLocked(ctx, c, 0); err != nil {
			return err
		}
		ids = append(ids, c.ID)
	}
	// The network goes while the pause and the shim stop: its teardown
	// mostly waits for the kernel (RCU grace periods), and the containers
	// no longer run.
	detached := make(chan error, 1)
	go func() { detached <- m.detachNetwork(ctx, pod) }()
	err := m.stopPodProcesses(ctx, pod, ctrs, ids)
	if err := errors.Join(err, <-detached); err != nil {
		return err
	}
	if err := podns.Remove(m.nsDir(pod.ID)); err != nil {
		return err
	}
	crashpoint.Hit("stop pod", "namespaces removed")
	if pod.State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY && pod.PausePID == 0 {
		return nil
	}
	m.opts.NRI.StopPodSandbox(ctx, pod)
	return m.podNotReady(pod)
}

// stopPodProcesses stops the pod's pause and shim (which deletes the
// containers ids), then kills what outlived the shim.
func (m *Manager) stopPodProcesses(ctx context.Context, pod *store.Pod, ctrs []*store.Container, ids []string) error {
	if pod.PausePID > 0 {
		if err := m.killPause(ctx, pod.ID); err != nil {
			return err
		}
	}
	if err := m.stopShim(ctx, pod.ID, ids); err != nil {
		return err
	}
	crashpoint.Hit("stop pod", "shim stopped")
	return m.killLeftovers(pod, ctrs)
}

// detachNetwork releases the pod's network, when berth attached one.
func (m *Manager) detachNetwork(ctx context.Context, pod *store.Pod) error {
	if !hasPodNetwork(pod) {
		return nil
	}
	if err := m.opts.Network.Detach(ctx, podInfo(pod), pod.Pins[string(podns.Net)]); err != nil {
		return err
	}
	crashpoint.Hit("stop pod", "network detached")
	return nil
}

// killLeftovers kills what still runs of the pod's containers and pause
// after its shim died: no longer anyone's children, nothing else would stop
// them, and their cgroups could not be removed. When the shim stopped them,
// their cgroups are gone and there is nothing to do.
func (m *Manager) killLeftovers(pod *store.Pod, ctrs []*store.Container) error {
	if pod.Cgroup == "" {
		return nil
	}
	paths := []string{m.pauseCgroup(pod)}
	for _, c := range ctrs {
		paths = append(paths, m.opts.Cgroups.ContainerCgroupsPath(pod.Cgroup, c.ID))
	}
	var errs []error
	for _, p := range paths {
		errs = append(errs, m.opts.Cgroups.Kill(p))
	}
	return errors.Join(errs...)
}

// RemovePod stops the pod if needed and removes it with its containers,
// cgroup, files and record. Removing an unknown pod is not an error.
func (m *Manager) RemovePod(ctx context.Context, id string) error {
	pod, unlock, err := m.lockPod(id)
	if pod == nil {
		return err
	}
	defer unlock()
	if err := m.stopPodLocked(ctx, pod); err != nil {
		return err
	}
	ctrs := m.store.ContainersOf(pod.ID)
	for _, c := range ctrs {
		if err := m.removeContainerLocked(ctx, c); err != nil {
			return err
		}
	}
	shared, err := m.cgroupShared(pod)
	if err != nil {
		return err
	}
	// Empty when berthd died before making it. The kubelet names a pod's
	// cgroup after its uid, so every attempt of a pod has the same one: the
	// last attempt removed takes it.
	if pod.Cgroup != "" && !shared {
		if err := m.opts.Cgroups.RemovePod(pod.Cgroup); err != nil {
			return err
		}
		crashpoint.Hit("remove pod", "cgroup removed")
	}
	if err := podfiles.Remove(m.podDir(pod.ID)); err != nil {
		return err
	}
	crashpoint.Hit("remove pod", "files removed")
	if err := os.RemoveAll(m.podDir(pod.ID)); err != nil {
		return err
	}
	crashpoint.Hit("remove pod", "folder removed")
	if err := m.store.DeletePod(pod.ID); err != nil {
		return err
	}
	m.opts.NRI.RemovePodSandbox(ctx, pod)
	m.store.PublishPod(store.EventContainerDeleted, pod, pod.ID)
	return nil
}

// cgroupShared reports whether another pod has the same cgroup as pod.
func (m *Manager) cgroupShared(pod *store.Pod) (bool, error) {
	all, err := m.ListPods(store.Filter{})
	if err != nil {
		return false, err
	}
	for _, p := range all {
		if p.ID != pod.ID && p.Cgroup == pod.Cgroup {
			return true, nil
		}
	}
	return false, nil
}

// GetPod returns the pod whose ID is id or starts with id (CLI users type
// short IDs), or an error wrapping errkind.NotFound.
func (m *Manager) GetPod(id string) (*store.Pod, error) {
	return m.store.Pod(id)
}

// ListPods returns the pods f selects. They are shared with every other
// caller, and read-only: GetPod gives a copy to change.
func (m *Manager) ListPods(f store.Filter) ([]*store.Pod, error) {
	return m.store.ListPods(f)
}

// podNotReady records that a pod no longer runs (stopped, or its shim or
// pause is gone), and tells subscribers.
func (m *Manager) podNotReady(pod *store.Pod) error {
	pod.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	pod.PausePID = 0
	if err := m.store.SavePod(pod); err != nil {
		return err
	}
	m.store.Publish(store.EventContainerStopped, pod.ID, pod.ID)
	return nil
}
