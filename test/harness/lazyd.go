package harness

import (
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
)

// LazyServerPIDs are the live lazy layer servers (berthd lazy-serve,
// image/lazyd) of d: they outlive berthd.
func (d *Daemon) LazyServerPIDs() []int {
	return LiveProcessesWithArg(filepath.Join(d.State, "lazyd"))
}

// KillLazyServer kills d's lazy layer server as a crash of it would and
// waits until it is gone: its mounts stay, without a server.
func (d *Daemon) KillLazyServer() {
	d.t.Helper()
	pids := d.LazyServerPIDs()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(stopTimeout)
	for len(d.LazyServerPIDs()) > 0 {
		if time.Now().After(deadline) {
			d.t.Fatalf("lazy layer server %v survived SIGKILL for %s", pids, stopTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// detachLazyMounts detaches the lazy layers mounted under d's root.
func (d *Daemon) detachLazyMounts() {
	for _, m := range LazyMounts(d.Root) {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// LazyMounts are the lazy layers mounted under root.
func LazyMounts(root string) []string {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("fuse.berth-lazy"))
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range ms {
		if strings.HasPrefix(m.Mountpoint, strings.TrimSuffix(root, "/")+"/") {
			out = append(out, m.Mountpoint)
		}
	}
	return out
}
