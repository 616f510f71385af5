package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/sandbox/store"
)

// RestoredContainer is a container RestorePod made: its metadata name and
// ID.
type RestoredContainer struct {
	Name, ID string
}

// RestorePod makes a pod of cfg and, in it, a container of each of
// ctrCfgs from the pod checkpoint in the folder path (CheckpointPod's),
// matched by metadata name: created, not started; StartContainer has CRIU
// restore its processes. The checkpoint is read, never written. On any
// failure nothing of the pod is left. options must be empty: berth has
// none.
func (m *Manager) RestorePod(ctx context.Context, path string, cfg *runtimeapi.PodSandboxConfig, options map[string]string,
	ctrCfgs []*runtimeapi.ContainerConfig) (*store.Pod, []RestoredContainer, error) {
	if err := checkNoOptions(options); err != nil {
		return nil, nil, err
	}
	cks, err := m.loadPodCheckpoint(path, ctrCfgs)
	if err != nil {
		return nil, nil, err
	}
	pod, err := m.RunPod(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	restored, err := m.createRestoredContainers(ctx, pod, ctrCfgs, cks)
	if err != nil {
		if rerr := m.RemovePod(context.WithoutCancel(ctx), pod.ID); rerr != nil {
			err = fmt.Errorf("%w (and removing the pod %s it made failed: %v)", err, pod.ID, rerr)
		}
		return nil, nil, err
	}
	return pod, restored, nil
}

// createRestoredContainers creates in pod a container of each of ctrCfgs
// from its checkpoint in cks.
func (m *Manager) createRestoredContainers(ctx context.Context, pod *store.Pod, ctrCfgs []*runtimeapi.ContainerConfig, cks []*checkpoint) ([]RestoredContainer, error) {
	var restored []RestoredContainer
	for i, c := range ctrCfgs {
		ctr, err := m.createContainer(ctx, pod.ID, c, cks[i])
		if err != nil {
			return nil, fmt.Errorf("container_configs[%d] (%q): %w", i, c.GetMetadata().GetName(), err)
		}
		restored = append(restored, RestoredContainer{Name: c.Metadata.Name, ID: ctr.ID})
	}
	return restored, nil
}

// loadPodCheckpoint reads the pod checkpoint at path and the checkpoint of
// each container of ctrCfgs, whose names must be the checkpoint's, and
// checks each config against its checkpoint: the checkpoint, in its order.
func (m *Manager) loadPodCheckpoint(path string, ctrCfgs []*runtimeapi.ContainerConfig) ([]*checkpoint, error) {
	manifest, err := readPodCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if err := checkRestoredNames(manifest, ctrCfgs); err != nil {
		return nil, err
	}
	cks := make([]*checkpoint, len(ctrCfgs))
	for i, c := range ctrCfgs {
		ref := manifest.Containers[slices.IndexFunc(manifest.Containers, func(r podCkptContainerRef) bool { return r.Name == c.Metadata.Name })]
		source := fmt.Sprintf("container %q of the pod checkpoint %s", ref.Name, path)
		dir := filepath.Join(path, filepath.Clean("/"+ref.Dir))
		if cks[i], err = loadCheckpoint(dir, source); err != nil {
			return nil, corruptSource(source, "%v", err)
		}
		cks[i].matchProcess = true
		if err := m.checkRestoredImage(i, c, cks[i]); err != nil {
			return nil, err
		}
	}
	return cks, nil
}

// readPodCheckpoint reads the manifest of the pod checkpoint at path.
func readPodCheckpoint(path string) (*podCheckpoint, error) {
	if path == "" || !filepath.IsAbs(path) {
		return nil, errkind.Errorf(errkind.Invalid, "checkpoint_path %q: not an absolute path", path)
	}
	var manifest podCheckpoint
	if err := readDump(filepath.Join(path, podCkptManifest), &manifest); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errkind.Errorf(errkind.Invalid, "checkpoint_path %s: no pod checkpoint there (%v)", path, err)
		}
		return nil, errkind.Errorf(errkind.FailedPrecondition, "checkpoint_path %s: %v", path, err)
	}
	if manifest.Version != podCkptVersion {
		return nil, errkind.Errorf(errkind.FailedPrecondition, "checkpoint_path %s: %s is of version %d; this berth restores version %d",
			path, podCkptManifest, manifest.Version, podCkptVersion)
	}
	return &manifest, nil
}

// checkRestoredNames refuses container configs whose metadata names are
// not, each once, the names of the checkpoint's containers.
func checkRestoredNames(manifest *podCheckpoint, ctrCfgs []*runtimeapi.ContainerConfig) error {
	if len(ctrCfgs) == 0 {
		return errkind.Errorf(errkind.Invalid, "container_configs: empty; the checkpoint has containers %s", strings.Join(manifestNames(manifest), ", "))
	}
	seen := map[string]bool{}
	for i, c := range ctrCfgs {
		name := c.GetMetadata().GetName()
		switch {
		case name == "":
			return errkind.Errorf(errkind.Invalid, "container_configs[%d].metadata.name: empty", i)
		case seen[name]:
			return errkind.Errorf(errkind.Invalid, "container_configs[%d].metadata.name %q: given twice", i, name)
		case !slices.Contains(manifestNames(manifest), name):
			return errkind.Errorf(errkind.Invalid, "container_configs[%d].metadata.name %q: the checkpoint has no such container (it has %s)",
				i, name, strings.Join(manifestNames(manifest), ", "))
		}
		seen[name] = true
	}
	for _, name := range manifestNames(manifest) {
		if !seen[name] {
			return errkind.Errorf(errkind.Invalid, "container_configs: none for the checkpoint's container %q", name)
		}
	}
	return nil
}

// manifestNames are the names of the checkpoint's containers.
func manifestNames(manifest *podCheckpoint) []string {
	var names []string
	for _, r := range manifest.Containers {
		names = append(names, r.Name)
	}
	return names
}

// checkRestoredImage refuses container_configs[i] c unless its image is
// the one its container was checkpointed from, on the node.
func (m *Manager) checkRestoredImage(i int, c *runtimeapi.ContainerConfig, ck *checkpoint) error {
	ref := c.GetImage().GetImage()
	img, err := m.opts.Images.Get(ref)
	if errors.Is(err, image.ErrNotFound) {
		return errkind.Errorf(errkind.FailedPrecondition, "container_configs[%d].image.image %q: the image container %q was checkpointed from is not on this node: pull it first",
			i, ref, ck.config.Name)
	}
	if err != nil {
		return fmt.Errorf("container_configs[%d].image.image: %w", i, err)
	}
	if want := ck.config.RootfsImageRef; want != "" && img.ID != want {
		return errkind.Errorf(errkind.Invalid, "container_configs[%d].image.image %q is image %s; container %q was checkpointed from image %s (%s)",
			i, ref, img.ID, ck.config.Name, ck.config.RootfsImageName, want)
	}
	return nil
}
