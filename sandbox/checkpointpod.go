package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/store"
)

// A pod checkpoint is a folder: podCkptManifest, which names the pod and
// its checkpointed containers, and for each container a folder
// containers/<container ID>/ holding what CheckpointContainer's archive
// holds (CRIU's images under ckptImagesDir, config.dump, spec.dump,
// rootfs-diff.tar, deleted.files, CRIU's log and statistics).
const (
	podCkptManifest   = "pod.json"
	podCkptContainers = "containers"
	podCkptVersion    = 1
)

// podCheckpoint is podCkptManifest.
type podCheckpoint struct {
	Version        int                   `json:"version"`
	PodID          string                `json:"podSandboxId"`
	Config         json.RawMessage       `json:"podSandboxConfig"` // the checkpointed pod's, as protojson
	CheckpointedAt time.Time             `json:"checkpointedTime"`
	Containers     []podCkptContainerRef `json:"containers"`
}

// podCkptContainerRef is a checkpointed container: its metadata name,
// which RestorePod matches container configs by, and its folder, relative
// to the checkpoint's.
type podCkptContainerRef struct {
	Name string `json:"name"`
	ID   string `json:"id"`
	Dir  string `json:"dir"`
}

// CheckpointPod has CRIU checkpoint the running containers ids of pod
// podID into the empty folder out, together: every one is frozen before
// the first is dumped and thawed after the last, so that the checkpoint is
// one moment of the pod's. On any failure the containers are thawed and
// run on, and out is empty again. options must be empty: berth has none.
func (m *Manager) CheckpointPod(ctx context.Context, podID, out string, ids []string, options map[string]string) (err error) {
	if err := checkNoOptions(options); err != nil {
		return err
	}
	if err := checkOutputPath(out); err != nil {
		return err
	}
	if err := checkContainerIDs(ids); err != nil {
		return err
	}
	pod, unlock, err := m.lockPod(podID)
	if err != nil {
		return err
	}
	if pod == nil {
		return errkind.Errorf(errkind.NotFound, "pod_sandbox_id: pod %q", podID)
	}
	defer unlock()
	if pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return errkind.Errorf(errkind.FailedPrecondition, "pod %s is not ready: only a running pod can be checkpointed", pod.ID)
	}
	ctrs, err := m.podCheckpointContainers(pod, ids)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, emptyFolder(out))
		}
	}()
	thaw, err := m.freezeAll(pod, ctrs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, thaw()) }()
	manifest := podCheckpoint{Version: podCkptVersion, PodID: pod.ID}
	if manifest.Config, err = protojson.Marshal(pod.Config); err != nil {
		return err
	}
	for _, c := range ctrs {
		ref, err := m.dumpPodContainer(ctx, c, out)
		if err != nil {
			return err
		}
		manifest.Containers = append(manifest.Containers, ref)
	}
	manifest.CheckpointedAt = time.Now()
	return writeJSON(filepath.Join(out, podCkptManifest), manifest)
}

// dumpPodContainer checkpoints c into its folder under out.
func (m *Manager) dumpPodContainer(ctx context.Context, c *store.Container, out string) (podCkptContainerRef, error) {
	ref := podCkptContainerRef{Name: c.Config.GetMetadata().GetName(), ID: c.ID, Dir: filepath.Join(podCkptContainers, c.ID)}
	timeout, err := checkpointTimeout(ctx, c.ID, 0)
	if err != nil {
		return ref, err
	}
	work := filepath.Join(out, ref.Dir)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return ref, err
	}
	return ref, m.dumpContainer(ctx, c, work, timeout)
}

// checkNoOptions refuses runtime-specific options: berth has none, and an
// option ignored would be a request silently not served.
func checkNoOptions(options map[string]string) error {
	if len(options) == 0 {
		return nil
	}
	return errkind.Errorf(errkind.Invalid, "options: unknown key %q: berth has no checkpoint or restore options", slices.Sorted(maps.Keys(options))[0])
}

// checkOutputPath refuses an output path that is not an absolute path of
// an existing, empty folder: the checkpoint's files are its only content,
// and removing them on failure must take nothing of the caller's.
func checkOutputPath(out string) error {
	if out == "" || !filepath.IsAbs(out) {
		return errkind.Errorf(errkind.Invalid, "output_path %q: not an absolute path", out)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		return errkind.Errorf(errkind.Invalid, "output_path %s: an existing folder is needed: %v", out, err)
	}
	if len(entries) > 0 {
		return errkind.Errorf(errkind.Invalid, "output_path %s: not empty (has %s)", out, entries[0].Name())
	}
	return nil
}

// checkContainerIDs refuses an empty list of containers, an empty ID and
// a duplicate.
func checkContainerIDs(ids []string) error {
	if len(ids) == 0 {
		return errkind.Errorf(errkind.Invalid, "container_ids: empty; name the containers to checkpoint")
	}
	for i, id := range ids {
		if id == "" {
			return errkind.Errorf(errkind.Invalid, "container_ids[%d]: empty", i)
		}
		if j := slices.Index(ids[:i], id); j >= 0 {
			return errkind.Errorf(errkind.Invalid, "container_ids[%d]: %s is container_ids[%d] too", i, id, j)
		}
	}
	return nil
}

// podCheckpointContainers are the containers ids of pod (locked), each
// running, with names unique among them (RestorePod matches by name), on a
// node whose CRIU can checkpoint.
func (m *Manager) podCheckpointContainers(pod *store.Pod, ids []string) ([]*store.Container, error) {
	var ctrs []*store.Container
	names := map[string]string{}
	for i, id := range ids {
		c, err := m.GetContainer(id)
		if err != nil {
			return nil, fmt.Errorf("container_ids[%d]: %w", i, err)
		}
		if c.PodID != pod.ID {
			return nil, errkind.Errorf(errkind.Invalid, "container_ids[%d]: container %s is of pod %s, not of pod %s", i, id, c.PodID, pod.ID)
		}
		if err := m.checkRunning(c); err != nil {
			return nil, err
		}
		name := c.Config.GetMetadata().GetName()
		if other, ok := names[name]; ok {
			return nil, errkind.Errorf(errkind.FailedPrecondition, "containers %s and %s are both named %q: a restore could not tell them apart", other, id, name)
		}
		names[name] = id
		ctrs = append(ctrs, c)
	}
	return ctrs, m.checkCRIU()
}

// freezeAll freezes the cgroups of ctrs, and returns what thaws them; a
// failure thaws those it froze.
func (m *Manager) freezeAll(pod *store.Pod, ctrs []*store.Container) (thaw func() error, err error) {
	var frozen []string
	thaw = func() error {
		var errs []error
		for _, cg := range frozen {
			errs = append(errs, m.opts.Cgroups.Freeze(cg, false))
		}
		return errors.Join(errs...)
	}
	for _, c := range ctrs {
		cg := m.opts.Cgroups.ContainerCgroupsPath(pod.Cgroup, c.ID)
		if err := m.opts.Cgroups.Freeze(cg, true); err != nil {
			return nil, errors.Join(fmt.Errorf("freeze container %s: %w", c.ID, err), thaw())
		}
		frozen = append(frozen, cg)
	}
	return thaw, nil
}

// emptyFolder removes everything in dir, leaving dir.
func emptyFolder(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}
