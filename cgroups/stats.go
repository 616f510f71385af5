package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/opencontainers/cgroups/fscommon"
)

// Stats is a snapshot of one cgroup (a container's or a pod's), counting
// everything below it.
type Stats struct {
	Timestamp             time.Time
	CPUUsageNanos         uint64
	MemoryUsageBytes      uint64
	MemoryWorkingSetBytes uint64 // usage minus inactive file pages, as cadvisor and the kubelet's eviction use
	MemoryRSSBytes        uint64
	MemoryCacheBytes      uint64 // page cache (v1 cache, v2 file)
	PageFaults            uint64
	MajorPageFaults       uint64
	Pids                  uint64
	OOMKills              uint64
}

// Stats reads the cgroup at cgroupsPath (a pod cgroup or a container's
// cgroups path as handed out by this package). A missing cgroup is an error
// that matches os.ErrNotExist. It reads the five files it reports from and
// no more (a library's full stats read some twenty per cgroup on v1): a
// full node's collector samples hundreds of cgroups each second.
func (m *Manager) Stats(cgroupsPath string) (Stats, error) {
	rel, err := m.fsPath(cgroupsPath)
	if err != nil {
		return Stats{}, err
	}
	out := Stats{Timestamp: time.Now()}
	if m.mode == V2 {
		err = m.statsV2(filepath.Join(m.root, rel), &out)
	} else {
		err = m.statsV1(rel, &out)
	}
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
	}
	return out, nil
}

// statsV2 reads a unified cgroup; its counters count its children's.
func (m *Manager) statsV2(dir string, out *Stats) error {
	// A file of a controller that is not enabled here is missing, and its
	// figures zero; a missing cgroup must not look idle.
	if _, err := os.Stat(dir); err != nil {
		return err
	}
	cpu, err := readKeyValues(dir, "cpu.stat")
	if err != nil {
		return err
	}
	out.CPUUsageNanos = cpu["usage_usec"] * 1000
	if out.MemoryUsageBytes, err = readUint(dir, "memory.current"); err != nil {
		return err
	}
	ms, err := readKeyValues(dir, "memory.stat")
	if err != nil {
		return err
	}
	out.setMemory(ms["inactive_file"], ms["anon"], ms["file"], ms["pgfault"], ms["pgmajfault"])
	if out.Pids, err = readUint(dir, "pids.current"); err != nil {
		return err
	}
	return m.readOOMKills(dir, out)
}

// statsV1 reads a cgroup of the v1 hierarchies. memory.stat has the
// cgroup's own counters and hierarchical "total_" ones; a pod cgroup has no
// processes of its own, so take the totals.
func (m *Manager) statsV1(rel string, out *Stats) error {
	dir := func(controller string) string {
		if mnt, ok := m.hier[controller]; ok {
			return filepath.Join(mnt, rel)
		}
		return "" // not mounted: its files are missing, its figures zero
	}
	memDir := dir("memory")
	if _, err := os.Stat(memDir); err != nil {
		return err
	}
	var err error
	if out.CPUUsageNanos, err = readUint(dir("cpuacct"), "cpuacct.usage"); err != nil {
		return err
	}
	if out.MemoryUsageBytes, err = readUint(memDir, "memory.usage_in_bytes"); err != nil {
		return err
	}
	ms, err := readKeyValues(memDir, "memory.stat")
	if err != nil {
		return err
	}
	total := func(k string) uint64 {
		if v, ok := ms["total_"+k]; ok {
			return v
		}
		return ms[k]
	}
	out.setMemory(total("inactive_file"), total("rss"), total("cache"), total("pgfault"), total("pgmajfault"))
	if out.Pids, err = readUint(dir("pids"), "pids.current"); err != nil {
		return err
	}
	return m.readOOMKills(memDir, out)
}

// setMemory fills the memory figures; the working set is the usage minus
// the inactive file pages, as cadvisor and the kubelet's eviction count it.
func (s *Stats) setMemory(inactiveFile, rss, cache, faults, majorFaults uint64) {
	if inactiveFile < s.MemoryUsageBytes {
		s.MemoryWorkingSetBytes = s.MemoryUsageBytes - inactiveFile
	}
	s.MemoryRSSBytes, s.MemoryCacheBytes, s.PageFaults, s.MajorPageFaults = rss, cache, faults, majorFaults
}

// readOOMKills sets the OOM kill count; without the memory controller there
// is nothing to count them in.
func (m *Manager) readOOMKills(memDir string, out *Stats) error {
	n, err := m.oomKills(memDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	out.OOMKills = n
	return err
}

// readUint reads a file of one number in dir; a missing file or dir (its
// controller is not there) is 0.
func readUint(dir, name string) (uint64, error) {
	b, path, err := readControllerFile(dir, name)
	if b == nil || err != nil {
		return 0, err
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// readControllerFile reads dir/name: nil when it or dir ("": a v1
// controller that is not mounted) is missing.
func readControllerFile(dir, name string) (b []byte, path string, err error) {
	if dir == "" {
		return nil, "", nil
	}
	path = filepath.Join(dir, name)
	b, err = os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, path, nil
	}
	return b, path, err
}

// readKeyValues reads a file of "key number" lines (memory.stat, cpu.stat)
// in dir; a missing file or dir is empty.
func readKeyValues(dir, name string) (map[string]uint64, error) {
	b, path, err := readControllerFile(dir, name)
	if b == nil || err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for line := range bytes.Lines(b) {
		k, v, err := fscommon.ParseKeyValue(string(bytes.TrimSpace(line)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out[k] = v
	}
	return out, nil
}

// OOMKilled reports whether the kernel's OOM killer killed a process in the
// cgroup because of its memory limit: the oom_kill counter of memory.events
// (v2, includes children) or memory.oom_control (v1, kernel 4.13+, counts
// kills charged to this cgroup's own limit).
func (m *Manager) OOMKilled(cgroupsPath string) (bool, error) {
	rel, err := m.fsPath(cgroupsPath)
	if err != nil {
		return false, err
	}
	dir := filepath.Join(m.root, rel)
	if m.mode == V1 {
		mnt, ok := m.hier["memory"]
		if !ok {
			return false, errors.New("no memory cgroup hierarchy on this host")
		}
		dir = filepath.Join(mnt, rel)
	}
	n, err := m.oomKills(dir)
	if err != nil {
		return false, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
	}
	return n > 0, nil
}

// oomKills reads the oom_kill counter. A file without one is an error, not
// zero: it means a kernel too old to tell, and guessing would hide OOM kills.
func (m *Manager) oomKills(dir string) (uint64, error) {
	file := "memory.events"
	if m.mode == V1 {
		file = "memory.oom_control"
	}
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, err := fscommon.ParseKeyValue(sc.Text())
		if err != nil {
			return 0, fmt.Errorf("%s: %w", filepath.Join(dir, file), err)
		}
		if k == "oom_kill" {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%s has no oom_kill counter (kernel older than 4.13?)", filepath.Join(dir, file))
}
