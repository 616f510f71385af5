package image

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Mountpoint is the folder at which the filesystem holding dir is mounted:
// the highest folder above dir on dir's device. Two roots on one
// filesystem give one mount point, which is how the kubelet tells a split
// image and container filesystem from a shared one (it compares the CRI's
// FsId mount points); for the space it asks the kernel about that folder.
func Mountpoint(dir string) (string, error) {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("mount point of %s: %w", dir, err)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("mount point of %s: %w", dir, err)
	}
	for dir != "/" {
		var up unix.Stat_t
		if err := unix.Stat(filepath.Dir(dir), &up); err != nil {
			return "", fmt.Errorf("mount point of %s: %w", dir, err)
		}
		if up.Dev != st.Dev {
			break
		}
		dir = filepath.Dir(dir)
	}
	return dir, nil
}
