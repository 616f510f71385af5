package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podfiles"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
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

// RunPod creates a pod sandbox: its namespaces (pinned as files), cgroup,
// /etc files and /dev/shm, its shim, and for a shared PID namespace the
// pause process. A failure at any step undoes the steps before it.
func (m *Manager) RunPod(ctx context.Context, cfg *runtimeapi.PodSandboxConfig) (*store.Pod, error) {
	if err := validatePodConfig(cfg); err != nil {
		return nil, err
	}
	if err := m.checkPodFeatures(cfg); err != nil {
		return nil, err
	}
	userNS, err := podUserNS(cfg, m.features)
	if err != nil {
		return nil, err
	}
	pauseConf, err := m.pauseConfinementOf(cfg, userNS)
	if err != nil {
		return nil, err
	}
	pod := &store.Pod{ID: newID(), Config: cfg, State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY, CreatedAt: time.Now()}
	unlock := m.pods.lock(pod.ID)
	defer unlock()
	if err := m.reservePod(pod); err != nil {
		return nil, err
	}
	u := &undo{log: m.log, op: "run pod"}
	var shimStarted func() (*shim.Client, error)
	defer func() {
		if err := u.run(); err != nil {
			m.keepFailedPod(pod, shimStarted, err)
		}
	}()
	u.add("forget pod record", func() error { return m.store.DeletePod(pod.ID) })

	t := newTimeline(ctx)
	dir := m.podDir(pod.ID)
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	u.add("remove pod folder", func() error { return os.RemoveAll(dir) })

	// The shim needs only the pod's folder: it starts (a 10 MB binary and a
	// Go runtime, the longest step) while the namespaces, network, cgroup
	// and files are made.
	shimStarted = m.startShimAsync(ctx, dir)
	shimSet := false
	u.add("stop starting shim", func() error {
		if shimSet {
			return nil // "stop shim" below has stopped it
		}
		client, err := shimStarted()
		if err != nil {
			return nil // shim.Start killed what it started
		}
		m.setShim(pod.ID, client)
		return m.stopShim(context.WithoutCancel(ctx), pod.ID, nil)
	})

	ns := namespaceOptions(cfg)
	hostNet := ns.Network == runtimeapi.NamespaceMode_NODE
	hostname := cfg.Hostname
	if hostname == "" { // as containerd: a pod without one gets the node's
		var err error
		if hostname, err = os.Hostname(); err != nil {
			return nil, err
		}
	}
	var kinds []podns.Kind
	if !hostNet {
		kinds = append(kinds, podns.Kind("net"), podns.Kind("uts")) // a host-network pod keeps the host's name too
	}
	if ns.Ipc != runtimeapi.NamespaceMode_NODE {
		kinds = append(kinds, podns.Kind("ipc"))
	}
	nsOpts := podns.Options{Dir: m.nsDir(pod.ID), Hostname: hostname, Sysctls: cfg.GetLinux().GetSysctls()}
	if userNS != nil {
		kinds = append(kinds, podns.User)
		nsOpts.UIDMappings, nsOpts.GIDMappings = sysProcIDMap(userNS.Uids[0]), sysProcIDMap(userNS.Gids[0])
	}
	nsOpts.Kinds = kinds
	pins, err := podns.Create(nsOpts)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	u.add("remove namespace pins", func() error { return podns.Remove(m.nsDir(pod.ID)) })
	pod.Pins = map[string]string{}
	for k, p := range pins {
		pod.Pins[string(k)] = p
	}
	if err := openToPodRoot(dir, pod); err != nil {
		return nil, err
	}
	t.step("namespaces")

	if !hostNet {
		att, err := m.opts.Network.Attach(ctx, podInfo(pod), pins[podns.Net], portMappings(cfg.PortMappings))
		if err != nil {
			return nil, networkError(err)
		}
		u.add("detach pod network", func() error {
			return m.opts.Network.Detach(context.WithoutCancel(ctx), podInfo(pod), pins[podns.Net])
		})
		pod.IP, pod.AdditionalIPs = att.IP.String(), ipStrings(att.AdditionalIPs)
		t.step("network")
	}

	// Recorded before it is made: after a crash here, RemovePod finds it.
	pod.Cgroup = m.opts.Cgroups.PodCgroup(cfg.GetLinux().GetCgroupParent(), cfg.Metadata.Uid)
	if err := m.store.SavePod(pod); err != nil {
		return nil, err
	}
	if err := m.opts.Cgroups.CreatePod(pod.Cgroup, cfg.GetLinux().GetResources()); err != nil {
		return nil, fmt.Errorf("pod cgroup %s: %w", pod.Cgroup, err)
	}
	u.add("remove pod cgroup", func() error { return m.opts.Cgroups.RemovePod(pod.Cgroup) })
	t.step("cgroup")

	fileOpts := podfiles.Options{
		Dir: dir, Hostname: hostname, DNS: cfg.DnsConfig, HostNetwork: hostNet, PodIPs: podIPs(pod),
		HostIPC: ns.Ipc == runtimeapi.NamespaceMode_NODE,
	}
	if userNS != nil {
		fileOpts.RootUID, fileOpts.RootGID = int(userNS.Uids[0].HostId), int(userNS.Gids[0].HostId)
	}
	files, err := podfiles.Write(fileOpts)
	if err != nil {
		return nil, fmt.Errorf("pod files: %w", err)
	}
	u.add("remove pod files", func() error { return podfiles.Remove(dir) })
	pod.Files = map[string]string{"hosts": files.Hosts, "resolv": files.Resolv, "hostname": files.Hostname, "shm": files.Shm}
	t.step("files")

	client, err := shimStarted()
	if err != nil {
		return nil, fmt.Errorf("start shim: %w", err)
	}
	u.add("stop shim", func() error { return m.stopShim(context.WithoutCancel(ctx), pod.ID, []string{pauseID}) })
	m.setShim(pod.ID, client)
	shimSet = true
	t.step("shim")

	if ns.Pid == runtimeapi.NamespaceMode_POD {
		u.add("kill pause", func() error {
			return client.Kill(context.WithoutCancel(ctx), pauseID, syscall.SIGKILL, true)
		})
		if pod.PausePID, err = m.startPause(ctx, pod, client, pauseConf); err != nil {
			return nil, fmt.Errorf("pause process: %w", err)
		}
		if err := m.pinPIDNamespace(pod); err != nil {
			return nil, err
		}
		t.step("pause")
	}

	pod.State = runtimeapi.PodSandboxState_SANDBOX_READY
	pod.Timeline = t.steps
	if err := m.store.SavePod(pod); err != nil {
		return nil, err
	}
	crashpoint.Hit("run pod", "recorded ready") // the reply may be lost
	u.keep()
	m.store.Publish(store.EventContainerCreated, pod.ID, pod.ID)
	m.store.Publish(store.EventContainerStarted, pod.ID, pod.ID)
	m.metrics.ObserveTimeline("pod", pod.Timeline)
	m.log.Info("pod ready", "pod", pod.ID, "name", cfg.Metadata.Name, "namespace", cfg.Metadata.Namespace, "timeline", pod.Timeline)
	return pod, nil
}

// keepFailedPod keeps the record of a pod whose rollback failed, NOTREADY
// and saying what failed, with what the steps before the failed one made
// (its pins, IP, cgroup, files, shim), as containerd keeps such a sandbox:
// the kubelet stops and removes a NOTREADY pod, and StopPod and RemovePod
// undo whatever exists of it, after a restart too (the record is in bolt).
// A shim still starting is waited for (shimStarted, when the run got that
// far) and kept as the pod's, so that StopPod and RemovePod reach it.
func (m *Manager) keepFailedPod(pod *store.Pod, shimStarted func() (*shim.Client, error), failed error) {
	if shimStarted != nil {
		// Its error: no shim, nothing to stop. Its client is kept (the
		// same one again where the run had set it), so that StopPod and
		// RemovePod use it rather than leave it open beside their own.
		if client, err := shimStarted(); err == nil {
			m.setShim(pod.ID, client)
		}
	}
	pod.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	pod.CleanupFailed = failed.Error()
	if err := m.store.SavePod(pod); err != nil {
		// The record saved before (reserved, or with its cgroup) stays.
		m.log.Error("record a failed rollback", "pod", pod.ID, "err", err)
	}
	m.log.Error("pod kept NOTREADY after a failed rollback: StopPodSandbox and RemovePodSandbox finish it",
		"pod", pod.ID, "name", pod.Config.Metadata.Name, "namespace", pod.Config.Metadata.Namespace, "err", failed)
}

// reservePod records the pod (NOTREADY) unless a pod with the same metadata
// exists: the kubelet must remove an attempt before it can run it again.
func (m *Manager) reservePod(pod *store.Pod) error {
	m.names.Lock()
	defer m.names.Unlock()
	md := pod.Config.Metadata
	pods, err := m.store.ListPods(store.Filter{})
	if err != nil {
		return err
	}
	for _, p := range pods {
		o := p.Config.Metadata
		if o.Name == md.Name && o.Namespace == md.Namespace && o.Uid == md.Uid && o.Attempt == md.Attempt {
			return errkind.Errorf(errkind.AlreadyExists, "pod %s/%s (uid %s, attempt %d) already exists as %s", md.Namespace, md.Name, md.Uid, md.Attempt, p.ID)
		}
	}
	return m.store.SavePod(pod)
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
