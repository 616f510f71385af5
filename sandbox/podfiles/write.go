package podfiles

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cri/atomicfile"
)

// writeAtomic replaces path with data, owned by uid and gid, so that a
// reader sees the old or the new content, never a part. No fsync: the files
// live in volatile state that a reboot wipes anyway.
func writeAtomic(path string, data []byte, uid, gid int) error {
	// Containers may run as any user and must read these files.
	if err := atomicfile.WriteOwned(path, data, 0o644, uid, gid); err != nil {
		return fmt.Errorf("podfiles: write %s: %w", path, err)
	}
	return nil
}

// mountShm mounts a tmpfs at path unless one is already there (a repeated
// Write). If it fails it leaves nothing it made.
func mountShm(path string, size int64) error {
	made := true
	if err := os.Mkdir(path, 0o755); errors.Is(err, os.ErrExist) {
		made = false
	} else if err != nil {
		return fmt.Errorf("podfiles: shm: %w", err)
	}
	if mounted, err := isMountPoint(path); err != nil || mounted {
		return err
	}
	data := fmt.Sprintf("mode=1777,size=%d", size)
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("shm", path, "tmpfs", flags, data); err != nil {
		if made {
			os.Remove(path)
		}
		return fmt.Errorf("podfiles: mount shm at %s: %w", path, err)
	}
	return nil
}

// isMountPoint compares devices: a tmpfs mounted at path never shares its
// parent's device, which is all Write needs to know.
func isMountPoint(path string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(path), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// unmountAll peels every mount at path; MNT_DETACH because a container may
// still hold the shm busy while its pod is torn down.
func unmountAll(path string) error {
	for range 16 {
		err := unix.Unmount(path, unix.MNT_DETACH)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("podfiles: unmount %s: %w", path, err)
		}
	}
	return fmt.Errorf("podfiles: unmount %s: still mounted after 16 unmounts", path)
}
