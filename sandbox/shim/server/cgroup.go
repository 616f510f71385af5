package server

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A container's cgroups, as far as the shim handles them itself: its
// processes, its OOM kills, and their removal when libcontainer need not
// (see shim.OpReply.DeleteByOp).

// oomKills reads the oom_kill count of a cgroup's memory.events (v2) or
// memory.oom_control (v1).
func oomKills(path string) (uint64, error) {
	if path == "" {
		return 0, errors.New("no OOM counter")
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no oom_kill", path)
}

// signalCgroup signals every process in a container's cgroup and the
// cgroups below it (processes that outlived init in a shared PID namespace
// included). A cgroup that is gone has nothing to signal.
func signalCgroup(dir string, sig unix.Signal) error {
	if dir == "" {
		return nil
	}
	// cgroup v2 (Linux 5.14+) kills a whole subtree in the kernel, forks in
	// flight included, which a pass over cgroup.procs cannot promise; on
	// v1, or an older kernel, the file is missing and the pass below runs.
	if sig == unix.SIGKILL && os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) == nil {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if err := unix.Kill(pid, sig); err != nil && err != unix.ESRCH {
				return err
			}
		}
		return nil
	})
}

// destroy removes a stopped container as libcontainer's Destroy does, for
// a container whose removal needs nothing of libcontainer's: what is left in
// its cgroup (processes of a shared PID namespace) is killed, its cgroups
// removed, then its state folder.
func (s *Server) destroy(c *ctr) error {
	if err := signalCgroup(c.cgroup, unix.SIGKILL); err != nil {
		return err
	}
	for _, p := range c.cgroupPaths {
		if err := removeCgroup(p); err != nil {
			return fmt.Errorf("remove cgroup of %s: %w", c.id, err)
		}
	}
	return os.RemoveAll(filepath.Join(s.lcRoot, c.id))
}

// removeCgroup removes a cgroup folder and the cgroups below it. A cgroup
// whose killed processes are still exiting is busy for a moment: the
// removal is tried again, for about a second in all.
func removeCgroup(path string) error {
	err := unix.Rmdir(path)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	ents, rerr := os.ReadDir(path)
	if errors.Is(rerr, os.ErrNotExist) {
		return nil
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroup(filepath.Join(path, e.Name())); err != nil {
				return err
			}
		}
	}
	delay := time.Millisecond
	for range 10 {
		err = unix.Rmdir(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EINTR) {
			break
		}
		time.Sleep(delay)
		delay *= 2
	}
	return &os.PathError{Op: "rmdir", Path: path, Err: err}
}

// thaw unfreezes a container's cgroups: CRIU freezes them to checkpoint,
// and a CRIU killed mid-way (a checkpoint past its time) leaves them
// frozen. cgroup v2 has cgroup.freeze in each cgroup; v1 a freezer
// hierarchy of its own. A cgroup that is gone has nothing to thaw.
func thaw(paths map[string]string) error {
	if p, ok := paths["freezer"]; ok {
		err := os.WriteFile(filepath.Join(p, "freezer.state"), []byte("THAWED"), 0)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("thaw %s: %w", p, err)
		}
		return nil
	}
	p, ok := paths[""]
	if !ok {
		return nil
	}
	err := os.WriteFile(filepath.Join(p, "cgroup.freeze"), []byte("0"), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("thaw %s: %w", p, err)
	}
	return nil
}
