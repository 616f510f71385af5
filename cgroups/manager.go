package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	"github.com/opencontainers/cgroups/systemd"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Manager owns the pod cgroups of one host. It is safe for concurrent use:
// it keeps no state beyond what it detected at start.
type Manager struct {
	driver Driver
	mode   Mode
	root   string            // where the hierarchies are mounted
	hier   map[string]string // v1: subsystem → mount dir (see v1Hierarchies)
	caps   hostCaps
}

// New detects the host's cgroup mode and returns a Manager for the driver
// ("" means cgroupfs). The systemd driver needs a running systemd.
func New(driver Driver) (*Manager, error) {
	if driver == Systemd && !systemd.IsRunningSystemd() {
		return nil, errors.New("cgroup driver systemd: systemd is not running on this host (no /run/systemd/system); use the cgroupfs driver")
	}
	mode, err := detectMode(defaultRoot)
	if err != nil {
		return nil, err
	}
	return newManager(driver, defaultRoot, mode)
}

// newManager lets tests point the Manager at a fake cgroup tree in a temp dir.
func newManager(driver Driver, root string, mode Mode) (*Manager, error) {
	switch driver {
	case "":
		driver = Cgroupfs
	case Cgroupfs, Systemd:
	default:
		return nil, fmt.Errorf("unknown cgroup driver %q (want cgroupfs or systemd)", driver)
	}
	m := &Manager{driver: driver, mode: mode, root: root}
	switch mode {
	case V1:
		h, err := v1Hierarchies(root)
		if err != nil {
			return nil, err
		}
		m.hier = h
	case V2:
	default:
		return nil, fmt.Errorf("unknown cgroup mode %v", mode)
	}
	if root == defaultRoot {
		m.caps = defaultCaps()
	} else {
		m.caps = detectCaps(root, mode, m.hier)
	}
	return m, nil
}

// Mode is the host's cgroup mode, detected at start.
func (m *Manager) Mode() Mode { return m.mode }

// Driver is the cgroup driver in use.
func (m *Manager) Driver() Driver { return m.driver }

// CreatePod creates the pod cgroup (in every v1 hierarchy, or the v2 dir with
// controllers enabled down to it so that container children can use them) and
// applies the pod-level resources, which may be nil. On failure, directories
// it made are removed again.
//
// A pod cgroup that exists already keeps its limits: it is the kubelet's,
// which sized it from every container and the RuntimeClass overhead. The
// CRI's pod-level resources add up only the limits containers declare, so
// in a pod where one container has none they would cap the whole pod at the
// others' sum.
func (m *Manager) CreatePod(podCgroup string, res *runtimeapi.LinuxContainerResources) error {
	// Checked either way: resources the host cannot honour are refused
	// even where they are not written.
	if _, err := specResources(res, m.mode, 0, m.caps); err != nil {
		return fmt.Errorf("pod cgroup %s: %w", podCgroup, err)
	}
	if m.podExists(podCgroup) {
		res = nil
	}
	return m.create(podCgroup, res, 0)
}

// podExists says whether the pod cgroup's directory is there already (in
// the first hierarchy under v1: whoever made it made it in all).
func (m *Manager) podExists(podCgroup string) bool {
	rel, err := m.podPath(podCgroup)
	if err != nil {
		return false // create reports it
	}
	_, err = os.Stat(m.dirs(rel)[0])
	return err == nil
}

// create makes a cgroup with resources mapped exactly as for a container's
// OCI spec; tests also use it to make container cgroups the way runc would.
func (m *Manager) create(podCgroup string, res *runtimeapi.LinuxContainerResources, pidsLimit int64) error {
	rel, err := m.podPath(podCgroup)
	if err != nil {
		return err
	}
	s, err := specResources(res, m.mode, pidsLimit, m.caps)
	if err != nil {
		return fmt.Errorf("pod cgroup %s: %w", podCgroup, err)
	}
	r := libResources(s, m.mode)
	if m.driver == Systemd {
		err = m.createSystemd(podCgroup, r)
	} else {
		// Without resources there is nothing to write to a v2 cgroup.
		err = m.createFS(rel, r, res != nil || pidsLimit != 0)
	}
	if err != nil {
		return fmt.Errorf("create pod cgroup %s: %w", podCgroup, err)
	}
	return nil
}

// podPath validates a pod cgroup and returns its path below the mounts.
func (m *Manager) podPath(podCgroup string) (string, error) {
	if m.driver == Systemd && strings.Contains(podCgroup, ":") {
		return "", fmt.Errorf("pod cgroup %q: want a slice name, not a container path", podCgroup)
	}
	rel, err := m.fsPath(podCgroup)
	if err != nil {
		return "", err
	}
	if rel == "/" {
		return "", fmt.Errorf("pod cgroup %q is the root cgroup", podCgroup)
	}
	return rel, nil
}

func (m *Manager) createFS(rel string, r *cgroups.Resources, set bool) (err error) {
	dirs := m.dirs(rel)
	tops := make([]string, len(dirs)) // per hierarchy, the topmost dir this call creates
	for i, d := range dirs {
		tops[i] = firstMissing(d)
	}
	defer func() {
		if err != nil {
			for i, top := range tops {
				if top != "" {
					removeUpTo(dirs[i], top)
				}
			}
		}
	}()
	if m.mode == V2 {
		if err := m.enableControllers(rel); err != nil {
			return err
		}
		if err := os.Mkdir(dirs[0], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if !set {
			return nil
		}
		mgr, err := fs2.NewManager(&cgroups.Cgroup{Resources: r}, dirs[0])
		if err != nil {
			return err
		}
		return mgr.Set(r)
	}
	paths := map[string]string{}
	for key, mnt := range m.hier {
		paths[key] = filepath.Join(mnt, rel)
	}
	mgr, err := fs.NewManager(&cgroups.Cgroup{Resources: r}, paths)
	if err != nil {
		return err
	}
	// Apply(-1) creates the dirs without moving a process in; it also fills
	// cpuset.cpus/mems from the parent, without which no task could join.
	if err := mgr.Apply(-1); err != nil {
		return err
	}
	// Hierarchies Apply skips (devices with SkipDevices, unknown names) get
	// the dir too: the pod cgroup exists in every hierarchy, as runc's
	// container cgroups under it will.
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return setV1(mgr, r)
}

// v1SetMu serializes Set on v1 managers (cgroupfs and systemd's legacy one):
// the fs package's controllers are shared package-level values that cache
// what they detect (blkio's weight file) without a lock, so two pods
// starting at once raced.
var v1SetMu sync.Mutex

func setV1(mgr cgroups.Manager, r *cgroups.Resources) error {
	v1SetMu.Lock()
	defer v1SetMu.Unlock()
	return mgr.Set(r)
}

// firstMissing returns the topmost missing dir on the way to dir, or "".
func firstMissing(dir string) string {
	top := ""
	for d := dir; !exists(d); d = filepath.Dir(d) {
		top = d
	}
	return top
}

// removeUpTo undoes a failed create: the new cgroup, then its new parents as
// long as they are empty (a concurrent create may have put a sibling there).
func removeUpTo(dir, top string) {
	if cgroups.RemovePath(dir) != nil {
		return
	}
	for d := filepath.Dir(dir); len(d) >= len(top); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			return
		}
	}
}

// enableControllers makes every controller of the root available to rel:
// each ancestor, created on the way, gets in its cgroup.subtree_control what
// it lacks. rel's own subtree_control is left to runc, which enables it when
// it creates a container below (as it does for every ancestor). Errors name
// the file: an ancestor holding processes cannot enable domain controllers,
// and containers would then run without their limits.
func (m *Manager) enableControllers(rel string) error {
	avail, err := os.ReadFile(filepath.Join(m.root, "cgroup.controllers"))
	if err != nil {
		return err
	}
	want := strings.Fields(string(avail))
	names := strings.Split(strings.Trim(rel, "/"), "/")
	dir := m.root
	for i := range names {
		if i > 0 {
			dir = filepath.Join(dir, names[i-1])
		}
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		cur, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		var have []string
		for _, c := range strings.Fields(string(cur)) {
			have = append(have, strings.TrimPrefix(c, "+"))
		}
		var add []string
		for _, c := range want {
			if !slices.Contains(have, c) {
				add = append(add, "+"+c)
			}
		}
		if len(add) == 0 {
			continue
		}
		if err := cgroups.WriteFile(dir, "cgroup.subtree_control", strings.Join(add, " ")); err != nil {
			return fmt.Errorf("enable controllers %s in %s: %w", strings.Join(add, " "), dir, err)
		}
	}
	return nil
}

// systemdManager is libcontainer's systemd manager for a pod slice: the
// slice unit goes under its parent slice, as the kubelet's do.
func (m *Manager) systemdManager(slice string, r *cgroups.Resources) (cgroups.Manager, error) {
	cg := &cgroups.Cgroup{Name: slice, Parent: parentSlice(slice), Resources: r, Systemd: true}
	if m.mode == V2 {
		return systemd.NewUnifiedManager(cg, "")
	}
	return systemd.NewLegacyManager(cg, nil)
}

func (m *Manager) createSystemd(slice string, r *cgroups.Resources) error {
	mgr, err := m.systemdManager(slice, r)
	if err != nil {
		return err
	}
	if err := mgr.Apply(-1); err != nil { // -1: start the slice with no process in it
		return err
	}
	if m.mode == V1 {
		return setV1(mgr, r)
	}
	return mgr.Set(r)
}

// RemovePod removes the pod cgroup with any container cgroups left in it.
// It kills nothing: if a process is still in there it fails and names the
// cgroup. A missing pod cgroup is not an error.
func (m *Manager) RemovePod(podCgroup string) error {
	rel, err := m.podPath(podCgroup)
	if err != nil {
		return err
	}
	dirs := m.dirs(rel)
	for _, d := range dirs {
		if err := checkNoProcs(d); err != nil {
			return fmt.Errorf("remove pod cgroup %s: %w", podCgroup, err)
		}
	}
	var errs []error
	if m.driver == Systemd {
		// Stop the slice unit so systemd forgets it; the dirs go below.
		mgr, err := m.systemdManager(podCgroup, &cgroups.Resources{SkipDevices: true})
		if err == nil {
			err = mgr.Destroy()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range dirs {
		if err := cgroups.RemovePath(d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove pod cgroup %s: %w", podCgroup, err)
	}
	return nil
}

// checkNoProcs fails if dir or a cgroup below it has a process in it, with
// EBUSY, as rmdir would: a process may be on its way out, and a caller may
// retry.
func checkNoProcs(dir string) error {
	return walkProcs(dir, func(cg string, pids []string) error {
		return fmt.Errorf("cgroup %s still has processes (pids %s): %w", cg, strings.Join(pids, " "), unix.EBUSY)
	})
}

// walkProcs calls fn for dir and every cgroup below it that holds
// processes. A missing dir holds none.
func walkProcs(dir string, fn func(cg string, pids []string) error) error {
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		procs, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		if pids := strings.Fields(string(procs)); len(pids) > 0 {
			return fn(p, pids)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Kill sends SIGKILL to every process in the cgroup at cgroupsPath (as this
// package hands paths out) and below it, in every hierarchy, until none is
// left: processes whose shim died, which nothing else can stop any more. A
// missing cgroup has nothing to kill.
func (m *Manager) Kill(cgroupsPath string) error {
	rel, err := m.fsPath(cgroupsPath)
	if err != nil {
		return err
	}
	for range 100 {
		left := 0
		for _, d := range m.dirs(rel) {
			err := walkProcs(d, func(_ string, pids []string) error {
				for _, p := range pids {
					pid, err := strconv.Atoi(p)
					if err != nil {
						return fmt.Errorf("cgroup %s: bad pid %q", cgroupsPath, p)
					}
					if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
						return fmt.Errorf("kill %d in cgroup %s: %w", pid, cgroupsPath, err)
					}
					left++
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		if left == 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // a killed process leaves its cgroup as it exits
	}
	return fmt.Errorf("cgroup %s: processes left after 1 s of SIGKILL", cgroupsPath)
}
