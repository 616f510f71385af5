package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/rootfs"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/sandbox/store"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func (m *Manager) layout(c *store.Container, lowers []string) rootfs.Layout {
	return rootfs.Layout{
		Lowers: lowers,
		Upper:  filepath.Join(m.layerDir(c), "upper"),
		Work:   filepath.Join(m.layerDir(c), "work"),
		Target: filepath.Join(m.bundleDir(c.PodID, c.ID), "rootfs"),
	}
}

// podLayout is the layout of a container of pod: idmapped through the pod's
// user namespace, if it has one.
func (m *Manager) podLayout(pod *store.Pod, c *store.Container, lowers []string) rootfs.Layout {
	l := m.layout(c, lowers)
	if pin := pod.Pins[string(podns.User)]; pin != "" {
		u := namespaceOptions(pod.Config).GetUsernsOptions()
		l.UserNS, l.RootUID, l.RootGID = pin, int(u.Uids[0].HostId), int(u.Gids[0].HostId)
	}
	return l
}

// CreateContainer prepares a container in a ready pod: leases its image's
// layers, mounts its rootfs and image volumes, writes its OCI spec and has
// the shim create it.
func (m *Manager) CreateContainer(ctx context.Context, podID string, cfg *runtimeapi.ContainerConfig) (*store.Container, error) {
	switch {
	case cfg.GetMetadata().GetName() == "":
		return nil, errkind.Errorf(errkind.Invalid, "config.metadata.name is required")
	case cfg.GetImage().GetImage() == "":
		return nil, errkind.Errorf(errkind.Invalid, "config.image.image is required")
	}
	if err := checkLogPath(cfg.GetLogPath()); err != nil {
		return nil, err
	}
	if err := m.checkFeatures(cfg); err != nil {
		return nil, err
	}
	pod, unlock, err := m.lockPod(podID)
	if pod == nil {
		if err == nil {
			err = errkind.Errorf(errkind.NotFound, "pod %q", podID)
		}
		return nil, err
	}
	defer unlock()
	if pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, errkind.Errorf(errkind.FailedPrecondition, "pod %s is not ready", pod.ID)
	}
	if err := checkContainerUserns(pod, cfg); err != nil {
		return nil, err
	}
	pidNS, err := m.containerNamespaces(pod, cfg)
	if err != nil {
		return nil, err
	}
	// InvalidArgument, as for userns_options above: the container's field
	// contradicts its pod's config, which no retry in this pod changes.
	if err := spec.CheckPrivileged(pod.Config, cfg); err != nil {
		return nil, errkind.Errorf(errkind.Invalid, "%v", err)
	}
	if err := m.checkPause(ctx, pod); err != nil {
		return nil, err
	}
	img, err := m.opts.Images.Get(cfg.Image.Image)
	if errors.Is(err, image.ErrNotFound) {
		return nil, errkind.Errorf(errkind.NotFound, "image %q: pull it first", cfg.Image.Image)
	}
	if err != nil {
		return nil, fmt.Errorf("config.image.image: %w", err)
	}
	if _, err := spec.StopSignal(img.Config.Config.StopSignal); err != nil {
		return nil, errkind.Errorf(errkind.Invalid, "image %s: StopSignal: %v", img.ID, err)
	}
	if s := cfg.GetStopSignal(); s != runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT {
		if _, err := store.CRISignal(s); err != nil {
			return nil, errkind.Errorf(errkind.Invalid, "config.stop_signal: %v", err)
		}
	}
	// Checked before anything is made: a refusal here costs the kubelet's
	// retries no record, folder or mount.
	volumeImages, err := m.imageVolumeImages(cfg)
	if err != nil {
		return nil, err
	}
	specResources, err := cgroups.SpecResources(cfg.GetLinux().GetResources(), m.opts.Cgroups.Mode(), 0)
	if err != nil {
		return nil, errkind.Errorf(errkind.Invalid, "config.linux.resources: %v", err)
	}
	c := &store.Container{ID: newID(), PodID: pod.ID, Config: cfg, ImageID: img.ID, ImageRef: cfg.Image.Image,
		StopSignal: img.Config.Config.StopSignal, CreatedAt: time.Now(), LayerRoot: m.opts.ContainerRoot}
	c.ImageName, c.RepoDigest = img.Names(cmp.Or(cfg.Image.UserSpecifiedImage, cfg.Image.Image))
	if dir, p := pod.Config.GetLogDirectory(), cfg.GetLogPath(); dir != "" && p != "" {
		c.LogPath = filepath.Join(dir, p)
	}
	if err := m.reserveContainer(c); err != nil {
		return nil, err
	}
	u := &undo{log: m.log, op: "create container"}
	defer func() {
		if err := u.run(); err != nil {
			m.keepFailedContainer(c, err)
		}
	}()
	u.add("forget container record", func() error { return m.store.DeleteContainer(c.ID) })

	t := newTimeline(ctx)
	lowers, err := m.opts.Images.Lease(c.ID, img)
	if err != nil {
		return nil, err
	}
	u.add("release image layers", func() error { return m.opts.Images.Release(c.ID) })
	for _, d := range []struct{ path, undo string }{
		{m.layerDir(c), "remove writable layer folder"}, {m.bundleDir(pod.ID, c.ID), "remove bundle folder"},
	} {
		if err := privateDir(d.path); err != nil {
			return nil, err
		}
		u.add(d.undo, func() error { return os.RemoveAll(d.path) })
	}
	if err := openToPodRoot(m.bundleDir(pod.ID, c.ID), pod); err != nil {
		return nil, err
	}
	if pidNS.target != "" {
		pin := filepath.Join(m.bundleDir(pod.ID, c.ID), targetPIDPin)
		// Before the bundle's removal, which a mounted pin would fail.
		u.add("remove target PID namespace pin", func() error { return podns.RemovePin(pin) })
		if err := m.pinTargetPIDNamespace(ctx, pod, pidNS.target, pin); err != nil {
			return nil, err
		}
		pidNS.path = pin
	}
	l := m.podLayout(pod, c, lowers)
	if err := rootfs.Mount(l); err != nil {
		return nil, err
	}
	u.add("unmount rootfs", func() error { return rootfs.Unmount(l) })
	t.step("rootfs")
	imageVolumes, err := m.mountImageVolumes(u, pod, c, volumeImages)
	if err != nil {
		return nil, err
	}
	if len(imageVolumes) > 0 {
		t.step("image volumes")
	}

	s, err := m.spec(pod, c, img, l.Target, imageVolumes, pidNS, specResources)
	if err != nil {
		return nil, err
	}
	if err := checkIDMappable(s, pod.Pins[string(podns.User)]); err != nil {
		return nil, err
	}
	c.User = &s.Process.User
	c.Resources = specResources
	if err := writeJSON(filepath.Join(m.bundleDir(pod.ID, c.ID), "config.json"), s); err != nil {
		return nil, err
	}
	if c.LogPath != "" {
		if err := makeLogFolder(pod.Config.GetLogDirectory(), c.LogPath); err != nil {
			return nil, err
		}
	}
	t.step("spec")

	client, err := m.podShim(pod.ID)
	if err != nil {
		return nil, err
	}
	// From here on the shim may hold the container whatever the call
	// returns: the undo kills and deletes it in the shim, or the shim would
	// keep a container berthd does not know and refuse to shut down.
	u.add("delete container in shim", func() error { return m.discardInShim(ctx, client, c.ID) })
	// Not abandoned when the caller gives up: the undo must come after the
	// shim is done with the create, not race it.
	createCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shimCallTimeout)
	defer cancel()
	if err := client.Create(createCtx, shim.CreateRequest{ID: c.ID, Bundle: m.bundleDir(pod.ID, c.ID), LogPath: c.LogPath,
		LogDir: logRoot(pod.Config.GetLogDirectory()), Stdin: cfg.Stdin, StdinOnce: cfg.StdinOnce, TTY: cfg.Tty}); err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	// The container's init has joined its target's PID namespace: the pin
	// has served, and would keep the bundle from being removed.
	if pidNS.target != "" {
		if err := podns.RemovePin(pidNS.path); err != nil {
			return nil, err
		}
	}
	t.step("create")

	c.Timeline = t.steps
	if err := m.store.SaveContainer(c); err != nil {
		return nil, err
	}
	crashpoint.Hit("create container", "recorded") // the reply may be lost
	u.keep()
	m.store.Publish(store.EventContainerCreated, c.PodID, c.ID)
	m.metrics.ObserveTimeline("container", c.Timeline)
	return c, nil
}

// keepFailedContainer keeps the record of a container whose rollback
// failed, saying what failed, with what the steps before the failed one
// made (its image lease, writable layer, bundle, mounts): it shows as
// exited (store.statusOf), which the kubelet removes, and RemoveContainer undoes
// whatever exists of it, after a restart too (the record is in bolt).
func (m *Manager) keepFailedContainer(c *store.Container, failed error) {
	c.CleanupFailed = failed.Error()
	if err := m.store.SaveContainer(c); err != nil {
		// The record reserveContainer saved stays, and shows as created.
		m.log.Error("record a failed rollback", "container", c.ID, "err", err)
	}
	m.log.Error("container kept after a failed rollback: RemoveContainer finishes it",
		"pod", c.PodID, "container", c.ID, "name", c.Config.Metadata.Name, "err", failed)
}

// discardInShim undoes a create in the shim: kill, wait, delete. A
// container the shim never made is not an error.
func (m *Manager) discardInShim(ctx context.Context, client *shim.Client, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shimCallTimeout)
	defer cancel()
	err := client.Kill(ctx, id, syscall.SIGKILL, true)
	if err == nil {
		_, err = waitStopped(ctx, client, id, 10*time.Second)
	}
	if err == nil || shim.IsNotFound(err) || errors.Is(err, shim.ErrNotRunning) {
		err = client.Delete(ctx, id)
	}
	if shim.IsNotFound(err) || errors.Is(err, shim.ErrUnavailable) {
		return nil
	}
	return err
}

// spec builds the container's OCI runtime spec from its CRI config, the
// image config, the pod's namespaces, files and cgroup, the PID
// namespace containerNamespaces chose and the cgroup limits res.
func (m *Manager) spec(pod *store.Pod, c *store.Container, img *image.Image, rootfsPath string, imageVolumes map[int]string, pid pidNS, res *specs.LinuxResources) (*specs.Spec, error) {
	ns := namespaceOptions(pod.Config)
	in := spec.Input{
		ContainerID: c.ID, PodID: pod.ID, Config: c.Config, Pod: pod.Config, Image: img.Config.Config, RootfsPath: rootfsPath,
		NetNS: pod.Pins["net"], IPCNS: pod.Pins["ipc"], UTSNS: pod.Pins["uts"],
		HostNet: ns.Network == runtimeapi.NamespaceMode_NODE, HostIPC: ns.Ipc == runtimeapi.NamespaceMode_NODE,
		PIDNS: pid.path, HostPID: pid.host,
		HostsPath: pod.Files["hosts"], ResolvPath: pod.Files["resolv"], HostnamePath: pod.Files["hostname"], ShmPath: pod.Files["shm"],
		CgroupsPath: m.opts.Cgroups.ContainerCgroupsPath(pod.Cgroup, c.ID),
		Resources:   res, AppArmor: m.apparmor, CDI: m.opts.CDI, ImageVolumes: imageVolumes,
	}
	if pin := pod.Pins[string(podns.User)]; pin != "" {
		u := namespaceOptions(pod.Config).GetUsernsOptions()
		in.UserNS, in.UIDMappings, in.GIDMappings = pin, specIDMap(u.Uids[0]), specIDMap(u.Gids[0])
	}
	s, err := spec.Generate(in)
	if err != nil {
		// The request's fault, but for a host path whose filesystem fails
		// or hangs: that error says so itself.
		return nil, errkind.Default(errkind.Invalid, err)
	}
	return s, nil
}

func (m *Manager) reserveContainer(c *store.Container) error {
	m.names.Lock()
	defer m.names.Unlock()
	all := m.store.ContainersOf(c.PodID)
	md := c.Config.Metadata
	for _, o := range all {
		if o.Config.Metadata.Name == md.Name && o.Config.Metadata.Attempt == md.Attempt {
			return errkind.Errorf(errkind.AlreadyExists, "container %q (attempt %d) already exists in pod %s as %s", md.Name, md.Attempt, c.PodID, o.ID)
		}
	}
	return m.store.SaveContainer(c)
}

// StartContainer starts a created container.
func (m *Manager) StartContainer(ctx context.Context, id string) error {
	c, unlock, err := m.lockContainer(id)
	if err != nil {
		return err
	}
	defer unlock()
	if c.CleanupFailed != "" {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s: its create failed (%s): remove it", c.ID, c.CleanupFailed)
	}
	if st := m.containerState(c); st.Status != shim.StatusCreated {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is %s, not created", c.ID, st.Status)
	}
	client, err := m.podShim(c.PodID)
	if err != nil {
		return err
	}
	t := newTimeline(ctx)
	st, err := client.Start(ctx, c.ID)
	if err != nil {
		return err
	}
	m.setContainerState(c.PodID, st)
	crashpoint.Hit("start container", "started")
	t.step("start")
	m.metrics.ObserveTimeline("container", t.steps)
	// The start joins the create's phases in the timeline verbose status
	// shows; the container runs whatever this write does.
	c.Timeline = append(c.Timeline, t.steps...)
	if err := m.store.SaveContainer(c); err != nil {
		m.log.Warn("record container start phase", "container", c.ID, "err", err)
	}
	return nil
}

// StopContainer signals the container's stop signal, then SIGKILL once
// timeout has passed, and returns when it has exited. It is idempotent, as
// the CRI asks: an unknown container is OK.
func (m *Manager) StopContainer(ctx context.Context, id string, timeout time.Duration) error {
	c, unlock, err := m.lockContainer(id)
	if errors.Is(err, errkind.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()
	return m.stopContainerLocked(ctx, c, timeout)
}

func (m *Manager) stopContainerLocked(ctx context.Context, c *store.Container, timeout time.Duration) error {
	if m.containerState(c).Status == shim.StatusStopped {
		return nil
	}
	client, err := m.podShim(c.PodID)
	if err != nil {
		return err
	}
	if timeout > 0 {
		sig, _ := c.SignalInForce()
		if err := client.Kill(ctx, c.ID, sig, false); err != nil {
			return ignoreNeverMade(err)
		}
		crashpoint.Hit("stop container", "signalled")
		if exited, err := m.waitExit(ctx, client, c, timeout); err != nil || exited {
			return err
		}
	}
	if err := client.Kill(ctx, c.ID, syscall.SIGKILL, true); err != nil {
		return ignoreNeverMade(err)
	}
	exited, err := m.waitExit(ctx, client, c, killGrace)
	if err == nil && !exited {
		// Stuck (frozen, or in the kernel): saying "stopped" would let the
		// kubelet go on as if it were gone.
		return errkind.Errorf(errkind.DeadlineExceeded, "container %s still runs %v after SIGKILL", c.ID, killGrace)
	}
	return err
}

// ignoreNeverMade: a container the shim does not know, while its pod is
// locked, was recorded and never made in the shim (berthd died during its
// create). There is nothing to stop.
func ignoreNeverMade(err error) error {
	if shim.IsNotFound(err) {
		return nil
	}
	return err
}

// killGrace is how long a SIGKILLed container may take to be gone.
const killGrace = 10 * time.Second

// waitExit waits up to d for the container to exit, and records its exit
// (the shim's event may come after the reply).
func (m *Manager) waitExit(ctx context.Context, client *shim.Client, c *store.Container, d time.Duration) (bool, error) {
	st, err := waitStopped(ctx, client, c.ID, d)
	if err == nil && st.Status == shim.StatusStopped {
		m.setContainerState(c.PodID, st)
		return true, nil
	}
	return false, err
}

// waitStopped waits up to d for a process in the shim to stop; a timeout
// is no error, and the state returned is then not stopped.
func waitStopped(ctx context.Context, client *shim.Client, id string, d time.Duration) (shim.State, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	st, err := client.Wait(ctx, id)
	if errors.Is(err, context.DeadlineExceeded) {
		return shim.State{}, nil
	}
	return st, err
}

// RemoveContainer kills the container if it runs and removes it with its
// rootfs and writable layer. Removing an unknown container is not an error.
func (m *Manager) RemoveContainer(ctx context.Context, id string) error {
	c, unlock, err := m.lockContainer(id)
	if errors.Is(err, errkind.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()
	return m.removeContainerLocked(ctx, c)
}

func (m *Manager) removeContainerLocked(ctx context.Context, c *store.Container) error {
	if err := m.stopContainerLocked(ctx, c, 0); err != nil {
		return err
	}
	if client, err := m.podShim(c.PodID); err == nil {
		if err := client.Delete(ctx, c.ID); err != nil && !shim.IsNotFound(err) && !errors.Is(err, shim.ErrUnavailable) {
			return err
		}
		crashpoint.Hit("remove container", "deleted in shim")
	}
	if err := rootfs.Unmount(m.layout(c, nil)); err != nil {
		return err
	}
	if err := m.unmountImageVolumes(c.PodID, c.ID); err != nil {
		return err
	}
	crashpoint.Hit("remove container", "rootfs unmounted")
	if err := os.RemoveAll(m.layerDir(c)); err != nil {
		return err
	}
	if err := m.removeBundle(c.PodID, c.ID); err != nil {
		return err
	}
	crashpoint.Hit("remove container", "folders removed")
	m.stats.Forget(c.ID)
	m.metrics.Forget(c.ID)
	// Release first: a crash between the two leaves a record, which a retry
	// removes, never a lease nobody would release.
	if err := errors.Join(m.releaseImageVolumes(c), m.opts.Images.Release(c.ID)); err != nil {
		return err
	}
	crashpoint.Hit("remove container", "image released")
	if err := m.store.DeleteContainer(c.ID); err != nil {
		return err
	}
	m.store.Publish(store.EventContainerDeleted, c.PodID, c.ID)
	return nil
}

// lockContainer finds a container and locks its pod.
func (m *Manager) lockContainer(id string) (*store.Container, func(), error) {
	c, err := m.GetContainer(id)
	if err != nil {
		return nil, nil, err
	}
	unlock := m.pods.lock(c.PodID)
	if c, err = m.GetContainer(c.ID); err != nil { // removed while we waited
		unlock()
		return nil, nil, err
	}
	return c, unlock, nil
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
