package lazy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// DetachStale detaches the lazy layers mounted under root: a berthd that
// stopped left them without their server, and every access to them fails
// (ENOTCONN) until they go. Overlays of running containers keep the old
// mount as it is.
func DetachStale(root string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter(FSType))
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if !strings.HasPrefix(m.Mountpoint, strings.TrimSuffix(root, "/")+"/") {
			continue
		}
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("detach stale lazy layer %s: %w", m.Mountpoint, err))
		}
	}
	return errors.Join(errs...)
}
