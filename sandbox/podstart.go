package sandbox

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podfiles"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RunPod creates a pod sandbox: its namespaces (pinned as files), cgroup,
// /etc files and /dev/shm, its shim, and for a shared PID namespace the
// pause process. A failure at any step undoes the steps before it.
func (m *Manager) RunPod(ctx context.Context, cfg *runtimeapi.PodSandboxConfig) (*store.Pod, error) {
	r, err := m.newPodStart(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer m.opts.NRI.BlockSync()() // before the pod lock, as in CreateContainer
	unlock := m.pods.lock(r.pod.ID)
	defer unlock()
	if err := m.reservePod(r.pod); err != nil {
		return nil, err
	}
	defer func() {
		if err := r.u.run(); err != nil {
			m.keepFailedPod(r.pod, r.shimStarted, err)
		}
	}()
	r.u.add("forget pod record", func() error { return m.store.DeletePod(r.pod.ID) })
	ns := namespaceOptions(cfg)
	r.t = newTimeline(ctx)
	err = r.t.run([]startStep{
		{"", r.makeFolder, false},
		{"", r.startShim, false},
		{"namespaces", r.makeNamespaces, false},
		{"network", r.attachNetwork, r.hostNet},
		{"cgroup", r.makeCgroup, false},
		{"files", r.writeFiles, false},
		{"shim", r.awaitShim, false},
		{"pause", r.startPause, ns.Pid != runtimeapi.NamespaceMode_POD},
		{"", r.tellNRI, m.opts.NRI == nil},
	})
	if err != nil {
		return nil, err
	}
	if err := r.recordReady(); err != nil {
		return nil, err
	}
	m.store.Publish(store.EventContainerCreated, r.pod.ID, r.pod.ID)
	m.store.Publish(store.EventContainerStarted, r.pod.ID, r.pod.ID)
	m.metrics.ObserveTimeline("pod", r.pod.Timeline)
	m.log.Info("pod ready", "pod", r.pod.ID, "name", cfg.Metadata.Name, "namespace", cfg.Metadata.Namespace, "timeline", r.pod.Timeline)
	return r.pod, nil
}

// podStart is one RunPod under way: the pod it makes, what its steps made
// so far, the undo they registered and the timeline they record.
type podStart struct {
	m         *Manager
	ctx       context.Context
	pod       *store.Pod
	userNS    *runtimeapi.UserNamespace
	pauseConf pauseConfinement
	hostNet   bool
	hostname  string
	dir       string
	u         *undo
	t         *timeline

	// shimStarted waits for the shim startShim started; nil before.
	shimStarted func() (*shim.Client, error)
	// shimSet: awaitShim has made the shim the pod's, with its own undo.
	shimSet bool
	client  *shim.Client
	pins    map[podns.Kind]string
}

// newPodStart checks cfg against what berth and the kernel can do: a pod
// refused here leaves nothing behind, not even a record.
func (m *Manager) newPodStart(ctx context.Context, cfg *runtimeapi.PodSandboxConfig) (*podStart, error) {
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
	return &podStart{m: m, ctx: ctx, pod: pod, userNS: userNS, pauseConf: pauseConf,
		hostNet: namespaceOptions(cfg).Network == runtimeapi.NamespaceMode_NODE, dir: m.podDir(pod.ID),
		u: &undo{log: m.log, op: "run pod"}}, nil
}

func (r *podStart) makeFolder() error {
	if err := privateDir(r.dir); err != nil {
		return err
	}
	r.u.add("remove pod folder", func() error { return os.RemoveAll(r.dir) })
	return nil
}

// startShim starts the shim, which needs only the pod's folder: it starts
// (a 10 MB binary and a Go runtime, the longest step) while the
// namespaces, network, cgroup and files are made.
func (r *podStart) startShim() error {
	r.shimStarted = r.m.startShimAsync(r.ctx, r.dir)
	r.u.add("stop starting shim", func() error {
		if r.shimSet {
			return nil // "stop shim" has stopped it
		}
		client, err := r.shimStarted()
		if err != nil {
			return nil // shim.Start killed what it started
		}
		r.m.setShim(r.pod.ID, client)
		return r.m.stopShim(context.WithoutCancel(r.ctx), r.pod.ID, nil)
	})
	return nil
}

// makeNamespaces creates and pins the pod's namespaces: a host-network pod
// keeps the host's name too, and a pod without a hostname gets the
// node's, as containerd gives it.
func (r *podStart) makeNamespaces() error {
	cfg := r.pod.Config
	ns := namespaceOptions(cfg)
	r.hostname = cfg.Hostname
	if r.hostname == "" {
		var err error
		if r.hostname, err = os.Hostname(); err != nil {
			return err
		}
	}
	var kinds []podns.Kind
	if !r.hostNet {
		kinds = append(kinds, podns.Kind("net"), podns.Kind("uts"))
	}
	if ns.Ipc != runtimeapi.NamespaceMode_NODE {
		kinds = append(kinds, podns.Kind("ipc"))
	}
	nsOpts := podns.Options{Dir: r.m.nsDir(r.pod.ID), Hostname: r.hostname, Sysctls: cfg.GetLinux().GetSysctls()}
	if r.userNS != nil {
		kinds = append(kinds, podns.User)
		nsOpts.UIDMappings, nsOpts.GIDMappings = sysProcIDMap(r.userNS.Uids[0]), sysProcIDMap(r.userNS.Gids[0])
	}
	nsOpts.Kinds = kinds
	pins, err := podns.Create(nsOpts)
	if err != nil {
		return fmt.Errorf("namespaces: %w", err)
	}
	r.u.add("remove namespace pins", func() error { return podns.Remove(r.m.nsDir(r.pod.ID)) })
	r.pins = pins
	r.pod.Pins = map[string]string{}
	for k, p := range pins {
		r.pod.Pins[string(k)] = p
	}
	return openToPodRoot(r.dir, r.pod)
}

func (r *podStart) attachNetwork() error {
	pod, netns := r.pod, r.pins[podns.Net]
	att, err := r.m.opts.Network.Attach(r.ctx, podInfo(pod), netns, portMappings(pod.Config.PortMappings))
	if err != nil {
		return networkError(err)
	}
	r.u.add("detach pod network", func() error {
		return r.m.opts.Network.Detach(context.WithoutCancel(r.ctx), podInfo(pod), netns)
	})
	pod.IP, pod.AdditionalIPs = att.IP.String(), ipStrings(att.AdditionalIPs)
	return nil
}

// makeCgroup records the pod's cgroup before it makes it: after a crash
// here, RemovePod finds it.
func (r *podStart) makeCgroup() error {
	cfg := r.pod.Config
	r.pod.Cgroup = r.m.opts.Cgroups.PodCgroup(cfg.GetLinux().GetCgroupParent(), cfg.Metadata.Uid)
	if err := r.m.store.SavePod(r.pod); err != nil {
		return err
	}
	if err := r.m.opts.Cgroups.CreatePod(r.pod.Cgroup, cfg.GetLinux().GetResources()); err != nil {
		return fmt.Errorf("pod cgroup %s: %w", r.pod.Cgroup, err)
	}
	r.u.add("remove pod cgroup", func() error { return r.m.opts.Cgroups.RemovePod(r.pod.Cgroup) })
	return nil
}

// writeFiles writes the pod's hosts, resolv.conf and hostname, and makes
// its /dev/shm.
func (r *podStart) writeFiles() error {
	fileOpts := podfiles.Options{
		Dir: r.dir, Hostname: r.hostname, DNS: r.pod.Config.DnsConfig, HostNetwork: r.hostNet, PodIPs: podIPs(r.pod),
		HostIPC: namespaceOptions(r.pod.Config).Ipc == runtimeapi.NamespaceMode_NODE,
	}
	if r.userNS != nil {
		fileOpts.RootUID, fileOpts.RootGID = int(r.userNS.Uids[0].HostId), int(r.userNS.Gids[0].HostId)
	}
	files, err := podfiles.Write(fileOpts)
	if err != nil {
		return fmt.Errorf("pod files: %w", err)
	}
	r.u.add("remove pod files", func() error { return podfiles.Remove(r.dir) })
	r.pod.Files = map[string]string{"hosts": files.Hosts, "resolv": files.Resolv, "hostname": files.Hostname, "shm": files.Shm}
	return nil
}

// awaitShim waits for the shim startShim started and makes it the pod's.
func (r *podStart) awaitShim() error {
	client, err := r.shimStarted()
	if err != nil {
		return fmt.Errorf("start shim: %w", err)
	}
	r.u.add("stop shim", func() error { return r.m.stopShim(context.WithoutCancel(r.ctx), r.pod.ID, []string{pauseID}) })
	r.m.setShim(r.pod.ID, client)
	r.shimSet, r.client = true, client
	return nil
}

// startPause starts the PID 1 of a pod that shares one PID namespace, and
// pins that namespace.
func (r *podStart) startPause() error {
	r.u.add("kill pause", func() error {
		return r.client.Kill(context.WithoutCancel(r.ctx), pauseID, syscall.SIGKILL, true)
	})
	var err error
	if r.pod.PausePID, err = r.m.startPause(r.ctx, r.pod, r.client, r.pauseConf); err != nil {
		return fmt.Errorf("pause process: %w", err)
	}
	return r.m.pinPIDNamespace(r.pod)
}

// recordReady records the pod ready, with its timeline: from here on the
// run stands, whether or not its reply reaches the kubelet.
func (r *podStart) recordReady() error {
	r.pod.State = runtimeapi.PodSandboxState_SANDBOX_READY
	r.pod.Timeline = r.t.steps
	if err := r.m.store.SavePod(r.pod); err != nil {
		return err
	}
	r.u.keep("recorded ready")
	return nil
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

// tellNRI tells NRI plugins of the pod, whose refusal fails it.
func (r *podStart) tellNRI() error {
	// Registered first: a plugin that answered before another refused has
	// been told of the pod.
	r.u.add("tell NRI plugins the pod is gone", func() error {
		r.m.opts.NRI.RemovePodSandbox(r.ctx, r.pod)
		return nil
	})
	return r.m.opts.NRI.RunPodSandbox(r.ctx, r.pod)
}
