package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
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
// that matches os.ErrNotExist.
func (m *Manager) Stats(cgroupsPath string) (Stats, error) {
	rel, err := m.fsPath(cgroupsPath)
	if err != nil {
		return Stats{}, err
	}
	out := Stats{Timestamp: time.Now()}
	var st *cgroups.Stats
	var memDir string
	opts := &cgroups.StatsOptions{Controllers: cgroups.CPU | cgroups.Memory | cgroups.Pids}
	if m.mode == V2 {
		memDir = filepath.Join(m.root, rel)
		if _, err := os.Stat(memDir); err != nil {
			return Stats{}, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
		}
		mgr, err := fs2.NewManager(&cgroups.Cgroup{Resources: &cgroups.Resources{}}, memDir)
		if err != nil {
			return Stats{}, err
		}
		if st, err = mgr.Stats(opts); err != nil {
			return Stats{}, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
		}
	} else {
		paths := map[string]string{}
		for _, c := range []string{"cpu", "cpuacct", "memory", "pids"} {
			if mnt, ok := m.hier[c]; ok {
				paths[c] = filepath.Join(mnt, rel)
			}
		}
		memDir = paths["memory"]
		// The fs manager skips missing dirs silently; a missing cgroup must not look idle.
		if _, err := os.Stat(memDir); err != nil {
			return Stats{}, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
		}
		mgr, err := fs.NewManager(&cgroups.Cgroup{Resources: &cgroups.Resources{}}, paths)
		if err != nil {
			return Stats{}, err
		}
		if st, err = mgr.Stats(opts); err != nil {
			return Stats{}, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
		}
	}

	ms := st.MemoryStats.Stats
	// v1 memory.stat has this cgroup's own counters and hierarchical
	// "total_" ones; a pod cgroup has no processes of its own, so take the
	// totals. v2 counters are always hierarchical.
	key := func(v1, v2 string) uint64 {
		if m.mode == V2 {
			return ms[v2]
		}
		if v, ok := ms["total_"+v1]; ok {
			return v
		}
		return ms[v1]
	}
	out.CPUUsageNanos = st.CpuStats.CpuUsage.TotalUsage
	out.MemoryUsageBytes = st.MemoryStats.Usage.Usage
	if inactive := key("inactive_file", "inactive_file"); inactive < out.MemoryUsageBytes {
		out.MemoryWorkingSetBytes = out.MemoryUsageBytes - inactive
	}
	out.MemoryRSSBytes = key("rss", "anon")
	out.MemoryCacheBytes = key("cache", "file")
	out.PageFaults = key("pgfault", "pgfault")
	out.MajorPageFaults = key("pgmajfault", "pgmajfault")
	out.Pids = st.PidsStats.Current
	// Without the memory controller there is nothing to count OOM kills in.
	if n, err := m.oomKills(memDir); err == nil {
		out.OOMKills = n
	} else if !errors.Is(err, os.ErrNotExist) {
		return Stats{}, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
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
