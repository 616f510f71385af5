package rootfs

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// MountImage mounts an image volume: the image's layers (bottom first),
// read-only, on target, which it creates. With userNS (a user namespace
// pin) the layers are idmapped through it, as a container's rootfs layers
// are, so that the image's root-owned files are the pod's root's.
//
// The image is mounted here, on the host, and the container gets a bind
// mount of it (or of a sub-path inside it), rather than an overlay entry in
// its OCI spec: the sub-path is then resolved in the mounted tree before
// the container exists, the idmapping is berth's own (overlayfs itself
// cannot be idmapped; its layers can), and a failed create unmounts it
// like the rootfs, with nothing left to the runtime.
//
// overlayfs without an upper layer needs two lower layers at least, so a
// one-layer image is a read-only bind mount of its layer instead.
// On failure nothing it created is left.
func MountImage(lowers []string, target, userNS string) (err error) {
	if len(lowers) == 0 {
		return errors.New("rootfs: image has no layers")
	}
	if err := os.Mkdir(target, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(target)
		}
	}()
	if len(lowers) == 1 {
		return bindLayerReadOnly(lowers[0], target, userNS)
	}
	lowers = slices.Clone(lowers)
	if userNS != "" {
		attached, err := idmapLowers(lowers, userNS, target+".idmap")
		if err != nil {
			return err
		}
		defer attached.release()
		lowers = attached.paths
	}
	slices.Reverse(lowers) // overlayfs lists lower dirs top first
	opts := "lowerdir=" + strings.Join(lowers, ":")
	if len(opts) >= os.Getpagesize() {
		return fmt.Errorf("rootfs: overlay options for %d layers exceed one page (%d bytes)", len(lowers), len(opts))
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_RDONLY, opts); err != nil {
		return fmt.Errorf("rootfs: mount image overlay on %s: %w", target, err)
	}
	return nil
}

// bindLayerReadOnly attaches a read-only (and, with userNS, idmapped) bind
// mount of layer on target. The attributes are set on the detached tree, so
// the mount is never writable, not even for a moment.
func bindLayerReadOnly(layer, target, userNS string) error {
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if userNS != "" {
		ns, err := os.Open(userNS)
		if err != nil {
			return fmt.Errorf("rootfs: user namespace: %w", err)
		}
		defer ns.Close()
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(ns.Fd())
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, layer, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("rootfs: open_tree %s: %w", layer, err)
	}
	defer unix.Close(tree)
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		if userNS != "" {
			return idmapRefused(layer, err)
		}
		return fmt.Errorf("rootfs: make %s read-only: %w", layer, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("rootfs: attach %s on %s: %w", layer, target, err)
	}
	return nil
}

// UnmountImage detaches an image volume MountImage made and removes its
// mount point, also after a crash half way through MountImage. One that is
// already gone is not an error.
func UnmountImage(target string) error {
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("rootfs: unmount %s: %w", target, err)
	}
	errs := []error{detachIDMapped(target + ".idmap")}
	// Remove, never RemoveAll: were the image still mounted, that would
	// lead into its layers.
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
