// Package rootfs mounts a container's root filesystem: an overlay of the
// image's read-only snapshots with a writable layer of the container's own.
package rootfs

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Layout names the folders of one container's rootfs.
type Layout struct {
	Lowers []string // image snapshot folders, bottom layer first
	Upper  string   // the container's writable layer (persistent root)
	Work   string   // overlayfs work folder, on the same filesystem as Upper
	Target string   // where the merged rootfs is mounted (volatile state)
}

// Mount creates Upper, Work and Target and mounts the overlay on Target.
// On failure nothing it created is left.
func Mount(l Layout) (err error) {
	if len(l.Lowers) == 0 {
		return errors.New("rootfs: image has no layers")
	}
	var made []string
	defer func() {
		if err != nil {
			for _, d := range slices.Backward(made) {
				os.RemoveAll(d)
			}
		}
	}()
	for _, d := range []string{l.Upper, l.Work, l.Target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		made = append(made, d)
	}
	// overlayfs lists lower dirs top first.
	lowers := slices.Clone(l.Lowers)
	slices.Reverse(lowers)
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + l.Upper + ",workdir=" + l.Work
	if len(opts) >= os.Getpagesize() {
		return fmt.Errorf("rootfs: overlay options for %d layers exceed one page (%d bytes)", len(lowers), len(opts))
	}
	if err := unix.Mount("overlay", l.Target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("rootfs: mount overlay on %s: %w", l.Target, err)
	}
	return nil
}

// Unmount detaches the overlay and removes Target, Upper and Work. A rootfs
// that was never mounted, or is already gone, is not an error.
func Unmount(l Layout) error {
	if err := unix.Unmount(l.Target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("rootfs: unmount %s: %w", l.Target, err)
	}
	var errs []error
	for _, d := range []string{l.Target, l.Upper, l.Work} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
