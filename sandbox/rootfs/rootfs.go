// Package rootfs mounts a container's root filesystem: an overlay of the
// image's read-only snapshots with a writable layer of the container's own;
// and its image volumes: the snapshots of another image, read-only.
package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/berth-runtime/berth/cri/errkind"
	"golang.org/x/sys/unix"
)

// Layout names the folders of one container's rootfs.
type Layout struct {
	Lowers []string // image snapshot folders, bottom layer first
	Upper  string   // the container's writable layer (persistent root)
	Work   string   // overlayfs work folder, on the same filesystem as Upper
	Target string   // where the merged rootfs is mounted (volatile state)
	// UpperMade: Upper exists already, holding the changes of a
	// restored container; Mount neither makes it nor removes it.
	UpperMade bool

	// UserNS, when set, is a user namespace (a pin file) the container runs
	// in: the lower layers are idmapped through it and Upper's root belongs
	// to RootUID:RootGID, the host IDs of its root.
	UserNS           string
	RootUID, RootGID int
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
	dirs := []string{l.Upper, l.Work, l.Target}
	if l.UpperMade {
		dirs = dirs[1:]
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		made = append(made, d)
	}
	lowers := slices.Clone(l.Lowers)
	if l.UserNS != "" {
		attached, err := idmapLowers(l.Lowers, l.UserNS, l.Target+".idmap")
		if err != nil {
			return err
		}
		defer attached.release()
		lowers = attached.paths
		// The container's root owns its writable layer's root.
		if err := os.Lchown(l.Upper, l.RootUID, l.RootGID); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
	}
	// overlayfs lists lower dirs top first.
	slices.Reverse(lowers)
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + l.Upper + ",workdir=" + l.Work
	if len(opts+volatile) >= os.Getpagesize() {
		return fmt.Errorf("rootfs: overlay options for %d layers exceed one page (%d bytes)", len(lowers), len(opts+volatile))
	}
	if err := mountOverlay(l.Target, opts); err != nil {
		return fmt.Errorf("rootfs: mount overlay on %s: %w", l.Target, err)
	}
	return nil
}

const volatile = ",volatile"

// mountOverlay mounts the overlay volatile where the kernel can (Linux
// 5.10): overlayfs then skips syncing its upper layer, and the unmount at a
// container's removal no longer syncs the whole filesystem the layer is on
// (ovl_sync_fs syncs upper's filesystem, tens of ms with other writers on
// it). Nothing needs the layer on disk: a container's writable layer does
// not outlive its container (the kubelet makes new containers after a
// reboot), and berth never mounts it again. The price is that fsync
// inside the container's rootfs (not its volumes) returns without
// syncing. A kernel without the option refuses it as an unknown one, and
// is not asked again.
func mountOverlay(target, opts string) error {
	if !noVolatile.Load() {
		err := unix.Mount("overlay", target, "overlay", 0, opts+volatile)
		if !errors.Is(err, unix.EINVAL) {
			return err
		}
	}
	err := unix.Mount("overlay", target, "overlay", 0, opts)
	if err == nil {
		noVolatile.Store(true)
	}
	return err
}

// noVolatile is set once the kernel has refused volatile and taken the same
// overlay without it.
var noVolatile atomic.Bool

// Unmount detaches the overlay and removes Target, Upper and Work. A rootfs
// that was never mounted, or is already gone, is not an error.
func Unmount(l Layout) error {
	if err := unix.Unmount(l.Target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("rootfs: unmount %s: %w", l.Target, err)
	}
	errs := []error{detachIDMapped(l.Target + ".idmap")}
	for _, d := range []string{l.Target, l.Upper, l.Work} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// idmappedLowers are the idmapped lower layers, attached for the time the
// overlay is mounted: Linux before 6.5 refuses a detached mount as an
// overlay layer ("failed to clone lowerpath"), so each detached idmapped tree
// is moved onto a numbered folder of dir first. The overlay holds private
// clones of its layers, so release detaches them again right after the
// mount, and nothing of them outlives Mount.
type idmappedLowers struct {
	dir   *os.File // the folder holding the mount points, kept open for paths
	paths []string // lowerdir paths through dir's descriptor, bottom first
}

// idmapLowers makes an idmapped mount (through the user namespace pinned at
// userNS) of each of lowers, attached under dir, which it creates.
//
// Only the lower layers are idmapped: a root-owned image file then shows as
// the container's root inside, and copy-up and new files land in Upper with
// the container's host IDs (overlayfs creates them as the caller, whose
// IDs are host IDs). Idmapping Upper too would store files as host root,
// so that a file the container made would be root's, or setuid root, on
// the host.
func idmapLowers(lowers []string, userNS, dir string) (_ *idmappedLowers, err error) {
	ns, err := os.Open(userNS)
	if err != nil {
		return nil, fmt.Errorf("rootfs: user namespace: %w", err)
	}
	defer ns.Close()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	// A failed return releases what was made (made, not a named result,
	// which the return would set to nil before the deferred release).
	made := &idmappedLowers{}
	if made.dir, err = os.Open(dir); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	defer func() {
		if err != nil {
			made.release()
		}
	}()
	for i, d := range lowers {
		if err := made.attach(d, int(ns.Fd()), strconv.Itoa(i)); err != nil {
			return nil, err
		}
	}
	return made, nil
}

// attach mounts an idmapped view of layer on the folder name of a.dir. The
// overlay option names it through the open folder's descriptor, which keeps
// a lowerdir option short whatever the length of the state path.
func (a *idmappedLowers) attach(layer string, usernsFD int, name string) error {
	if err := os.Mkdir(filepath.Join(a.dir.Name(), name), 0o700); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	tree, err := IDMapTree(layer, usernsFD)
	if err != nil {
		return err
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", int(a.dir.Fd()), name, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("rootfs: attach idmapped %s: %w", layer, err)
	}
	a.paths = append(a.paths, fmt.Sprintf("/proc/self/fd/%d/%s", a.dir.Fd(), name))
	return nil
}

// release detaches every attached layer and removes the folder.
func (a *idmappedLowers) release() {
	a.dir.Close()
	detachIDMapped(a.dir.Name())
}

// detachIDMapped detaches the layer mounts under dir and removes it, also
// after a crash between attach and release. Never RemoveAll: a mount point
// still attached would lead it into an image layer.
func detachIDMapped(dir string) error {
	names, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, n := range names {
		p := filepath.Join(dir, n.Name())
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("rootfs: detach %s: %w", p, err))
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// IDMapTree returns a detached bind mount of dir, idmapped through the user
// namespace usernsFD (open_tree and mount_setattr, Linux 5.12, and a
// filesystem that supports idmapped mounts).
func IDMapTree(dir string, usernsFD int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("rootfs: open_tree %s: %w", dir, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(usernsFD)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, idmapRefused(dir, err)
	}
	return fd, nil
}

// idmapRefused explains a refused idmapping of layer dir. A lazily pulled
// layer is a FUSE filesystem, which Linux takes idmapped mounts of from
// 6.12 on (and then only from a server that offers them, as berth's does):
// before, the kernel answers EINVAL, and a user-namespaced pod cannot run
// over such a layer. That is the node's limit, not berth's fault, and the
// caller can act on it (pull the image whole). Any other refusal is not
// explained here.
func idmapRefused(dir string, err error) error {
	var fs unix.Statfs_t
	if errors.Is(err, unix.EINVAL) && unix.Statfs(dir, &fs) == nil && fs.Type == unix.FUSE_SUPER_MAGIC {
		return errkind.Errorf(errkind.FailedPrecondition,
			"rootfs: layer %s is a lazily pulled (FUSE) layer, which this kernel cannot idmap (FUSE takes idmapped mounts from Linux 6.12 on): a pod with a user namespace needs its image pulled whole ([image] lazy = false) or a newer kernel: %w", dir, err)
	}
	return fmt.Errorf("rootfs: idmap %s: %w", dir, err)
}
