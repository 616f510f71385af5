package cgroups

import (
	"fmt"
	"path/filepath"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
)

// Freeze freezes (frozen) or thaws the processes of the cgroup at
// cgroupsPath (as this package hands paths out) and below it, and returns
// once they are: the v1 freezer hierarchy's freezer.state, or v2's
// cgroup.freeze, as libcontainer's pause writes them, so that CRIU sees a
// paused container, dumps it and leaves it frozen. A failed freeze is
// thawed again.
func (m *Manager) Freeze(cgroupsPath string, frozen bool) error {
	rel, err := m.fsPath(cgroupsPath)
	if err != nil {
		return err
	}
	state := cgroups.Thawed
	if frozen {
		state = cgroups.Frozen
	}
	if m.mode == V2 {
		dir := m.dirs(rel)[0]
		mgr, err := fs2.NewManager(&cgroups.Cgroup{Resources: &cgroups.Resources{}}, dir)
		if err == nil {
			err = mgr.Freeze(state)
		}
		if err != nil {
			return fmt.Errorf("cgroup %s: %s: %w", cgroupsPath, state, err)
		}
		return nil
	}
	mnt, ok := m.hier["freezer"]
	if !ok {
		return fmt.Errorf("cgroup %s: no v1 freezer hierarchy on this host", cgroupsPath)
	}
	if err := (&fs.FreezerGroup{}).Set(filepath.Join(mnt, rel), &cgroups.Resources{Freezer: state}); err != nil {
		return fmt.Errorf("cgroup %s: %s: %w", cgroupsPath, state, err)
	}
	return nil
}
