package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/rootfs"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Image volumes (Mount.image): each is its image's layers, leased for as
// long as the container exists, mounted read-only in the container's bundle
// under image-volumes/<index of the mount>, and bound from there into the
// container by its OCI spec (spec.Input.ImageVolumes).

// imageVolumeOwner is the lease owner of the image of c's mount i. It starts
// with the container's ID, as its rootfs lease's owner is that ID, so that
// recovery tells whose lease it is (leaseContainer).
func imageVolumeOwner(containerID string, i int) string {
	return containerID + "/image-volume/" + strconv.Itoa(i)
}

// leaseContainer is the container a lease owner belongs to.
func leaseContainer(owner string) string {
	id, _, _ := strings.Cut(owner, "/")
	return id
}

func (m *Manager) imageVolumesDir(podID, containerID string) string {
	return filepath.Join(m.bundleDir(podID, containerID), "image-volumes")
}

// imageVolumeImages looks up the image of each of cfg's image mounts, by
// mount index. It has no side effect, so CreateContainer asks it before it
// makes anything: a kubelet retrying while a volume's image is still being
// pulled costs a lookup, not a rootfs mounted and unmounted.
func (m *Manager) imageVolumeImages(cfg *runtimeapi.ContainerConfig) (map[int]*image.Image, error) {
	images := map[int]*image.Image{}
	for i, mnt := range cfg.GetMounts() {
		ref := mnt.GetImage().GetImage()
		if ref == "" {
			continue
		}
		// The same lookup as the container's own image: the kubelet sends
		// the reference PullImage answered (the image ID), or a name.
		img, err := m.opts.Images.Get(ref)
		if errors.Is(err, image.ErrNotFound) {
			return nil, errkind.Errorf(errkind.NotFound, "mount %s: image %q: pull it first", mnt.GetContainerPath(), ref)
		}
		if err != nil {
			return nil, fmt.Errorf("mount %s: image %q: %w", mnt.GetContainerPath(), ref, err)
		}
		if len(img.ChainIDs) == 0 {
			return nil, errkind.Errorf(errkind.Invalid, "mount %s: image %q has no layers to mount", mnt.GetContainerPath(), ref)
		}
		images[i] = img
	}
	return images, nil
}

// mountImageVolumes leases and mounts images, those of c's image mounts by
// mount index (imageVolumeImages), and returns where, by mount index. What
// it did is undone through u.
func (m *Manager) mountImageVolumes(u *undo, pod *store.Pod, c *store.Container, images map[int]*image.Image) (map[int]string, error) {
	volumes := map[int]string{}
	if len(images) == 0 {
		return volumes, nil
	}
	dir := m.imageVolumesDir(pod.ID, c.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	u.add("remove image volumes folder", func() error { return os.Remove(dir) })
	// The runtime binds the volumes as the pod's root.
	if err := openToPodRoot(dir, pod); err != nil {
		return nil, err
	}
	// In mount order, as the undo's steps are named by the step reached.
	for i := range c.Config.GetMounts() {
		if img := images[i]; img != nil {
			target, err := m.mountImageVolume(u, pod, c, i, img)
			if err != nil {
				return nil, err
			}
			volumes[i] = target
		}
	}
	return volumes, nil
}

func (m *Manager) mountImageVolume(u *undo, pod *store.Pod, c *store.Container, i int, img *image.Image) (string, error) {
	dst, ref := c.Config.Mounts[i].GetContainerPath(), c.Config.Mounts[i].GetImage().GetImage()
	owner := imageVolumeOwner(c.ID, i)
	lowers, err := m.opts.Images.Lease(owner, img)
	if err != nil {
		return "", fmt.Errorf("mount %s: %w", dst, err)
	}
	u.add("release image volume layers", func() error { return m.opts.Images.Release(owner) })
	target := filepath.Join(m.imageVolumesDir(pod.ID, c.ID), strconv.Itoa(i))
	if err := rootfs.MountImage(lowers, target, pod.Pins[string(podns.User)]); err != nil {
		return "", fmt.Errorf("mount %s: image %q: %w", dst, ref, err)
	}
	u.add("unmount image volume", func() error { return rootfs.UnmountImage(target) })
	return target, nil
}

// unmountImageVolumes unmounts every image volume of a container's bundle
// and removes their folder; a bundle without one is not an error.
func (m *Manager) unmountImageVolumes(podID, containerID string) error {
	dir := m.imageVolumesDir(podID, containerID)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// A volume's folder is its mount index; "<index>.idmap" holds its
	// idmapped layers while it is being mounted, and may be all a crash
	// left of it.
	targets := map[string]bool{}
	for _, e := range entries {
		targets[strings.TrimSuffix(e.Name(), ".idmap")] = true
	}
	var errs []error
	for t := range targets {
		errs = append(errs, rootfs.UnmountImage(filepath.Join(dir, t)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(dir)
}

// releaseImageVolumes drops the leases of c's image volumes. Releasing one
// never taken (a create that failed before it) is not an error.
func (m *Manager) releaseImageVolumes(c *store.Container) error {
	var errs []error
	for i, mnt := range c.Config.GetMounts() {
		if mnt.GetImage().GetImage() != "" {
			errs = append(errs, m.opts.Images.Release(imageVolumeOwner(c.ID, i)))
		}
	}
	return errors.Join(errs...)
}
