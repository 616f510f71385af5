package lazy

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// DetachStale detaches the lazy layers mounted under root but those at
// the mount points served names: the others' server is gone (a berthd that
// stopped with it, a server that died), and every access to them fails
// (ENOTCONN) until they go. Overlays of running containers keep the old
// mount as it is.
func DetachStale(root string, served map[string]bool) error {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter(FSType))
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if !strings.HasPrefix(m.Mountpoint, strings.TrimSuffix(root, "/")+"/") || served[filepath.Clean(m.Mountpoint)] {
			continue
		}
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("detach stale lazy layer %s: %w", m.Mountpoint, err))
		}
	}
	return errors.Join(errs...)
}
