package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/sandbox/nri"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/rootfs"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/sandbox/store"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CreateContainer prepares a container in a ready pod: leases its image's
// layers, mounts its rootfs and image volumes, writes its OCI spec and has
// the shim create it.
func (m *Manager) CreateContainer(ctx context.Context, podID string, cfg *runtimeapi.ContainerConfig) (*store.Container, error) {
	return m.createContainer(ctx, podID, cfg, nil)
}

// createContainer creates a container, restored from the checkpoint from
// (RestorePod) unless that is nil.
func (m *Manager) createContainer(ctx context.Context, podID string, cfg *runtimeapi.ContainerConfig, from *checkpoint) (*store.Container, error) {
	if err := m.checkContainerConfig(cfg); err != nil {
		return nil, err
	}
	// Before the pod lock: a plugin's sync, which this blocks, takes pod locks.
	defer m.opts.NRI.BlockSync()()
	pod, unlock, err := m.lockPod(podID)
	if pod == nil {
		if err == nil {
			err = errkind.Errorf(errkind.NotFound, "pod %q", podID)
		}
		return nil, err
	}
	defer unlock()
	r, err := m.newContainerCreate(ctx, pod, cfg, from)
	if err != nil {
		return nil, err
	}
	if err := m.reserveContainer(r.c); err != nil {
		return nil, err
	}
	defer func() {
		if err := r.u.run(); err != nil {
			m.keepFailedContainer(r.c, err)
		}
	}()
	r.u.add("forget container record", func() error { return m.store.DeleteContainer(r.c.ID) })
	r.t = newTimeline(ctx)
	restoring, fromImage := r.c.Restored, r.c.Restored && from == nil
	err = r.t.run([]startStep{
		{"checkpoint", r.readCheckpoint, !fromImage},
		{"", r.leaseImage, false},
		{"", r.makeFolders, false},
		{"checkpoint copy", r.copyCRIUImages, from == nil},
		{"", r.pinTargetPIDNamespace, r.pidNS.target == ""},
		{"layer changes", r.applyLayerChanges, !restoring},
		{"rootfs", r.mountRootfs, false},
		{"image volumes", r.mountImageVolumes, len(r.volumeImages) == 0},
		{"spec", r.writeSpec, false},
		{"create", r.createInShim, false},
	})
	if err != nil {
		return nil, err
	}
	if err := r.recordCreated(); err != nil {
		return nil, err
	}
	m.store.Publish(store.EventContainerCreated, r.c.PodID, r.c.ID)
	m.metrics.ObserveTimeline("container", r.c.Timeline)
	m.opts.NRI.PostCreateContainer(ctx, pod, m.nriContainer(r.c))
	return r.c, nil
}

// containerCreate is one CreateContainer under way: the container it
// makes, in its pod, from its image, what its steps made so far, the undo
// they registered and the timeline they record.
type containerCreate struct {
	m             *Manager
	ctx           context.Context
	pod           *store.Pod
	c             *store.Container
	img           *image.Image
	pidNS         pidNS
	volumeImages  map[int]*image.Image
	specResources *specs.LinuxResources
	u             *undo
	t             *timeline

	lowers       []string
	layout       rootfs.Layout
	imageVolumes map[int]string
	restore      *checkpoint // the archive a restored container is made from
}

// checkContainerConfig checks what the container's config asks of berth
// and the kernel, before its pod is looked up.
func (m *Manager) checkContainerConfig(cfg *runtimeapi.ContainerConfig) error {
	switch {
	case cfg.GetMetadata().GetName() == "":
		return errkind.Errorf(errkind.Invalid, "config.metadata.name is required")
	case cfg.GetImage().GetImage() == "":
		return errkind.Errorf(errkind.Invalid, "config.image.image is required")
	}
	if err := checkLogPath(cfg.GetLogPath()); err != nil {
		return err
	}
	if err := spec.CheckReservedAnnotations("config.annotations", cfg.GetAnnotations()); err != nil {
		return errkind.Errorf(errkind.Invalid, "%v", err)
	}
	return m.checkFeatures(cfg)
}

// newContainerCreate checks cfg against its pod (locked) and its images,
// and makes the container's record. Checked before anything is made: a
// refusal here costs the kubelet's retries no record, folder or mount.
func (m *Manager) newContainerCreate(ctx context.Context, pod *store.Pod, cfg *runtimeapi.ContainerConfig, from *checkpoint) (*containerCreate, error) {
	pidNS, err := m.checkAgainstPod(ctx, pod, cfg)
	if err != nil {
		return nil, err
	}
	img, err := m.containerImage(cfg)
	if err != nil {
		return nil, err
	}
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
	if name, _ := checkpointOf(img); name != "" || from != nil {
		source := imageSource(cfg.Image.Image, img)
		if from != nil {
			source = from.source
		}
		if err := checkRestorable(source, pod.Pins[string(podns.User)] != "", cfg.GetTty()); err != nil {
			return nil, err
		}
		c.Restored = true
	}
	c.ImageName, c.RepoDigest = img.Names(cmp.Or(cfg.Image.UserSpecifiedImage, cfg.Image.Image))
	if dir, p := pod.Config.GetLogDirectory(), cfg.GetLogPath(); dir != "" && p != "" {
		c.LogPath = filepath.Join(dir, p)
	}
	return &containerCreate{m: m, ctx: ctx, pod: pod, c: c, img: img, pidNS: pidNS, volumeImages: volumeImages,
		specResources: specResources, restore: from, u: &undo{log: m.log, op: "create container"}}, nil
}

// checkAgainstPod checks the container's config against its pod's, and
// returns the PID namespace it gets.
func (m *Manager) checkAgainstPod(ctx context.Context, pod *store.Pod, cfg *runtimeapi.ContainerConfig) (pidNS, error) {
	if pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return pidNS{}, errkind.Errorf(errkind.FailedPrecondition, "pod %s is not ready", pod.ID)
	}
	if err := checkContainerUserns(pod, cfg); err != nil {
		return pidNS{}, err
	}
	ns, err := m.containerNamespaces(pod, cfg)
	if err != nil {
		return pidNS{}, err
	}
	// InvalidArgument, as for userns_options above: the container's field
	// contradicts its pod's config, which no retry in this pod changes.
	if err := spec.CheckPrivileged(pod.Config, cfg); err != nil {
		return pidNS{}, errkind.Errorf(errkind.Invalid, "%v", err)
	}
	return ns, m.checkPause(ctx, pod)
}

// containerImage is the container's image, pulled before, with the stop
// signals of the image and the config checked.
func (m *Manager) containerImage(cfg *runtimeapi.ContainerConfig) (*image.Image, error) {
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
	return img, nil
}

func (r *containerCreate) leaseImage() error {
	lowers, err := r.m.opts.Images.Lease(r.c.ID, r.img)
	if err != nil {
		return err
	}
	r.u.add("release image layers", func() error { return r.m.opts.Images.Release(r.c.ID) })
	r.lowers = lowers
	return nil
}

// makeFolders makes the writable layer's folder and the bundle's, which
// the root of the pod's user namespace may traverse.
func (r *containerCreate) makeFolders() error {
	bundle := r.m.bundleDir(r.pod.ID, r.c.ID)
	for _, d := range []struct{ path, undo string }{
		{r.m.layerDir(r.c), "remove writable layer folder"}, {bundle, "remove bundle folder"},
	} {
		if err := privateDir(d.path); err != nil {
			return err
		}
		r.u.add(d.undo, func() error { return os.RemoveAll(d.path) })
	}
	return openToPodRoot(bundle, r.pod)
}

// pinTargetPIDNamespace pins the PID namespace of the container a TARGET
// container joins, in its bundle, for the shim's create.
func (r *containerCreate) pinTargetPIDNamespace() error {
	pin := filepath.Join(r.m.bundleDir(r.pod.ID, r.c.ID), targetPIDPin)
	// Before the bundle's removal, which a mounted pin would fail.
	r.u.add("remove target PID namespace pin", func() error { return podns.RemovePin(pin) })
	if err := r.m.pinTargetPIDNamespace(r.ctx, r.pod, r.pidNS.target, pin); err != nil {
		return err
	}
	r.pidNS.path = pin
	return nil
}

func (r *containerCreate) mountRootfs() error {
	r.layout = r.m.podLayout(r.pod, r.c, r.lowers)
	r.layout.UpperMade = r.c.Restored
	if err := rootfs.Mount(r.layout); err != nil {
		return err
	}
	r.u.add("unmount rootfs", func() error { return rootfs.Unmount(r.layout) })
	return nil
}

func (r *containerCreate) mountImageVolumes() error {
	var err error
	r.imageVolumes, err = r.m.mountImageVolumes(r.u, r.pod, r.c, r.volumeImages)
	return err
}

// writeSpec writes the container's OCI spec, as NRI plugins adjust it,
// into its bundle, and makes its log's folder.
func (r *containerCreate) writeSpec() error {
	s, err := r.m.spec(r.pod, r.c, r.img, r.layout.Target, r.imageVolumes, r.pidNS, r.specResources)
	if err != nil {
		return err
	}
	// Registered first: a plugin that answered before another refused has
	// been told of the container.
	r.u.add("tell NRI plugins the container is gone", func() error {
		r.m.opts.NRI.RemoveContainer(r.ctx, r.pod, nri.Container{Rec: r.c})
		return nil
	})
	if err := r.m.opts.NRI.CreateContainer(r.ctx, r.pod, nri.Container{Rec: r.c, Spec: s}); err != nil {
		return err
	}
	if err := checkIDMappable(s, r.pod.Pins[string(podns.User)]); err != nil {
		return err
	}
	if r.restore != nil {
		if err := r.restore.checkProcess(s); err != nil {
			return err
		}
		r.restore.restoreProcess(s)
		if err := r.m.writeCRIUConfig(r.c); err != nil {
			return err
		}
	}
	r.c.User = &s.Process.User
	r.c.Resources = recordedResources(s)
	if err := writeJSON(filepath.Join(r.m.bundleDir(r.pod.ID, r.c.ID), "config.json"), s); err != nil {
		return err
	}
	if r.c.LogPath != "" {
		return makeLogFolder(r.pod.Config.GetLogDirectory(), r.c.LogPath)
	}
	return nil
}

// createInShim has the pod's shim create the container.
func (r *containerCreate) createInShim() error {
	client, err := r.m.podShim(r.pod.ID)
	if err != nil {
		return err
	}
	// From here on the shim may hold the container whatever the call
	// returns: the undo kills and deletes it in the shim, or the shim would
	// keep a container berthd does not know and refuse to shut down.
	r.u.add("delete container in shim", func() error { return r.m.discardInShim(r.ctx, client, r.c.ID) })
	// Not abandoned when the caller gives up: the undo must come after the
	// shim is done with the create, not race it.
	createCtx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), shimCallTimeout)
	defer cancel()
	cfg := r.c.Config
	req := shim.CreateRequest{ID: r.c.ID, Bundle: r.m.bundleDir(r.pod.ID, r.c.ID), LogPath: r.c.LogPath,
		LogDir: logRoot(r.pod.Config.GetLogDirectory()), Stdin: cfg.Stdin, StdinOnce: cfg.StdinOnce, TTY: cfg.Tty}
	create := client.Create
	if r.restore != nil {
		req.Restore, create = r.restoreRequest(), client.CreateRestored
	}
	if err := create(createCtx, req); err != nil {
		if errors.Is(err, shim.ErrNoRestore) {
			return errkind.Errorf(errkind.FailedPrecondition, "pod %s: its shim is from a berth without restores; a pod started now can restore: %v", r.pod.ID, err)
		}
		return fmt.Errorf("create container: %w", err)
	}
	// The container's init has joined its target's PID namespace: the pin
	// has served, and would keep the bundle from being removed.
	if r.pidNS.target != "" {
		return podns.RemovePin(r.pidNS.path)
	}
	return nil
}

// recordCreated records the container, with its timeline: from here on
// the create stands, whether or not its reply reaches the kubelet.
func (r *containerCreate) recordCreated() error {
	r.c.Timeline = r.t.steps
	if err := r.m.store.SaveContainer(r.c); err != nil {
		return err
	}
	r.u.keep("recorded")
	return nil
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
		CRIUConfig: filepath.Join(m.bundleDir(pod.ID, c.ID), shim.CRIUConfigFile),
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
