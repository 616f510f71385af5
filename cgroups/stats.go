package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
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
	PSI                   PSI // none on v1
	// MemoryLimitBytes is the memory limit (v2 memory.max, v1
	// memory.limit_in_bytes), 0 for none: the kubelet counts a container's
	// available memory from it.
	MemoryLimitBytes uint64
	Swap             Swap
}

// Swap is a cgroup's swap: what it uses and the swap alone it may use.
// The kubelet's summary shows both (and its eviction reads neither).
type Swap struct {
	Accounted bool   // the host accounts swap; without it there are no figures
	UsedBytes uint64 // v2 memory.swap.current, v1 memory.stat's swap
	// LimitBytes is the swap the cgroup may use where Limited: v2
	// memory.swap.max; v1 memory.memsw.limit_in_bytes, which is memory and
	// swap together, less the memory limit. 0 and Limited is no swap, as
	// the kubelet sets it for a container not allowed any.
	LimitBytes uint64
	Limited    bool
}

// Stats reads the cgroup at cgroupsPath (a pod cgroup or a container's
// cgroups path as handed out by this package). A missing cgroup is an error
// that matches os.ErrNotExist. It reads the files it reports from (seven on
// v1; eight on v2, and its three pressure files) and no more (a library's full stats read
// some twenty per cgroup on v1), with a fileReader: a full node's collector
// samples hundreds of cgroups each second.
func (m *Manager) Stats(cgroupsPath string) (Stats, error) {
	d, err := m.read(cgroupsPath, false)
	return d.Stats, err
}

// read reads the cgroup at cgroupsPath: Stats' files, and with full
// Details' too, each file once.
func (m *Manager) read(cgroupsPath string, full bool) (Details, error) {
	rel, err := m.fsPath(cgroupsPath)
	if err != nil {
		return Details{}, err
	}
	d := Details{Stats: Stats{Timestamp: time.Now()}}
	var r fileReader
	if m.mode == V2 {
		err = m.statsV2(&r, filepath.Join(m.root, rel), &d, full)
	} else {
		err = m.statsV1(&r, rel, &d, full)
	}
	if err != nil {
		return Details{}, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
	}
	return d, nil
}

// v2CPUStats are the cpu.stat keys read on v2: Stats' usage, then Details'
// (free to take: the file is read anyway). The throttling keys are there
// only where the cpu controller is enabled.
var v2CPUStats = []string{"usage_usec", "user_usec", "system_usec", "nr_periods", "nr_throttled", "throttled_usec"}

// v2MemoryStats are the memory.stat keys read on v2: setMemory's five,
// then Details' ("kernel" is there since Linux 5.18).
var v2MemoryStats = []string{"inactive_file", "anon", "file", "pgfault", "pgmajfault", "file_mapped", "kernel"}

// statsV2 reads a unified cgroup; its counters count its children's.
func (m *Manager) statsV2(r *fileReader, dir string, d *Details, full bool) error {
	// A file of a controller that is not enabled here is missing, and its
	// figures zero; a missing cgroup must not look idle.
	if err := statDir(dir); err != nil {
		return err
	}
	out := &d.Stats
	var cpu [6]uint64
	if _, err := r.keyValues(dir, "cpu.stat", v2CPUStats, cpu[:]); err != nil {
		return err
	}
	out.CPUUsageNanos = cpu[0] * 1000
	var err error
	if out.MemoryUsageBytes, err = r.uint(dir, "memory.current"); err != nil {
		return err
	}
	var ms [7]uint64
	memFound, err := r.keyValues(dir, "memory.stat", v2MemoryStats, ms[:])
	if err != nil {
		return err
	}
	out.setMemory([5]uint64(ms[:5]))
	if err := d.readMemoryLimitsV2(r, dir); err != nil {
		return err
	}
	if out.Pids, err = r.uint(dir, "pids.current"); err != nil {
		return err
	}
	if err := r.readPSI(dir, &out.PSI); err != nil {
		return err
	}
	if err := m.readOOMKills(r, dir, d, full); err != nil || !full {
		return err
	}
	d.CPUUserNanos, d.CPUSystemNanos = cpu[1]*1000, cpu[2]*1000
	d.CFSPeriods, d.CFSThrottledPeriods, d.CFSThrottledNanos = cpu[3], cpu[4], cpu[5]*1000
	d.MemoryMappedFileBytes = ms[5]
	d.MemoryKernelBytes, d.Has.KernelMemory = ms[6], memFound&(1<<6) != 0
	return d.readV2(r, dir)
}

// v1MemoryStats are the memory.stat keys read on v1: the hierarchical
// "total_" counters (a pod cgroup has no processes of its own), then the
// cgroup's own, taken where a kernel has no total. The first five are
// setMemory's, the last two Details' (swap is there only with swap
// accounting).
var v1MemoryStats = []string{"total_inactive_file", "total_rss", "total_cache", "total_pgfault", "total_pgmajfault",
	"total_mapped_file", "total_swap",
	"inactive_file", "rss", "cache", "pgfault", "pgmajfault", "mapped_file", "swap"}

// statsV1 reads a cgroup of the v1 hierarchies.
func (m *Manager) statsV1(r *fileReader, rel string, d *Details, full bool) error {
	dir := func(controller string) string {
		if mnt, ok := m.hier[controller]; ok {
			return filepath.Join(mnt, rel)
		}
		return "" // not mounted: its files are missing, its figures zero
	}
	memDir := dir("memory")
	if err := statDir(memDir); err != nil {
		return err
	}
	out := &d.Stats
	var err error
	if out.CPUUsageNanos, err = r.uint(dir("cpuacct"), "cpuacct.usage"); err != nil {
		return err
	}
	if out.MemoryUsageBytes, err = r.uint(memDir, "memory.usage_in_bytes"); err != nil {
		return err
	}
	var ms [14]uint64
	found, err := r.keyValues(memDir, "memory.stat", v1MemoryStats, ms[:])
	if err != nil {
		return err
	}
	for i := range 7 {
		if found&(1<<i) == 0 {
			ms[i], found = ms[i+7], found|(found>>7)&(1<<i)
		}
	}
	out.setMemory([5]uint64(ms[:5]))
	out.Swap.UsedBytes, out.Swap.Accounted = ms[6], found&(1<<6) != 0
	if err := d.readMemoryLimitsV1(r, memDir); err != nil {
		return err
	}
	if out.Pids, err = r.uint(dir("pids"), "pids.current"); err != nil {
		return err
	}
	if err := m.readOOMKills(r, memDir, d, full); err != nil || !full {
		return err
	}
	d.MemoryMappedFileBytes = ms[5]
	return d.readV1(r, dir("cpu"), dir("cpuacct"), memDir, dir("pids"), dir("blkio"))
}

// readMemoryLimitsV2 reads the memory limit of the unified cgroup at dir
// and, where the host accounts swap, the swap used and its limit, with the
// limits' Details figures.
func (d *Details) readMemoryLimitsV2(r *fileReader, dir string) error {
	mem, err := r.limit(dir, "memory.max")
	if err != nil {
		return err
	}
	d.MemoryLimitBytes, d.Has.MemorySpec = mem.zeroIfNone(), mem.found
	s := &d.Swap
	if s.UsedBytes, s.Accounted, err = r.optional(dir, "memory.swap.current"); err != nil || !s.Accounted {
		return err
	}
	swap, err := r.limit(dir, "memory.swap.max")
	if err != nil {
		return err
	}
	s.LimitBytes, s.Limited = swap.value, swap.limited
	d.Spec.MemorySwapLimitBytes, d.Has.SwapLimit = swap.zeroIfNone(), swap.found
	return nil
}

// readMemoryLimitsV1 reads the memory limit of the v1 memory cgroup at dir
// and, where the host accounts swap, the swap limit, with the limits'
// Details figures (memory.stat's swap, the swap used, is read before).
func (d *Details) readMemoryLimitsV1(r *fileReader, dir string) error {
	mem, err := r.limit(dir, "memory.limit_in_bytes")
	if err != nil {
		return err
	}
	d.MemoryLimitBytes, d.Has.MemorySpec = mem.zeroIfNone(), mem.found
	memsw, err := r.limit(dir, "memory.memsw.limit_in_bytes")
	if err != nil {
		return err
	}
	d.Spec.MemorySwapLimitBytes, d.Has.SwapLimit = memsw.zeroIfNone(), memsw.found
	// The kernel keeps memsw at or above the memory limit, so a limited
	// memsw has a limited memory below it.
	if s := &d.Swap; memsw.limited && mem.limited && memsw.value >= mem.value {
		s.LimitBytes, s.Limited = memsw.value-mem.value, true
	}
	return nil
}

// statDir is os.Stat's error for dir, without making its FileInfo.
func statDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	return nil
}

// setMemory fills the memory figures from memory.stat's inactive file
// pages, RSS (v2 anon), page cache (v2 file), page faults and major ones;
// the working set is the usage minus the inactive file pages, as cadvisor
// and the kubelet's eviction count it.
func (s *Stats) setMemory(ms [5]uint64) {
	if inactiveFile := ms[0]; inactiveFile < s.MemoryUsageBytes {
		s.MemoryWorkingSetBytes = s.MemoryUsageBytes - inactiveFile
	}
	s.MemoryRSSBytes, s.MemoryCacheBytes, s.PageFaults, s.MajorPageFaults = ms[1], ms[2], ms[3], ms[4]
}

// readOOMKills sets the OOM kill count, and with full the v2 failcnt
// (memory.events, read for it anyway); without the memory controller there
// is nothing to count them in.
func (m *Manager) readOOMKills(r *fileReader, memDir string, d *Details, full bool) error {
	n, max, err := m.memoryEvents(r, memDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	d.OOMKills = n
	if full && m.mode == V2 {
		d.MemoryFailcnt = max
	}
	return err
}

// fileReader reads cgroup files with plain system calls into a buffer of
// its own. os.ReadFile costs twice the calls (cgroup files are pollable, so
// each is added to and removed from the netpoller) and allocates per file,
// and the collector reads five to eight files of each of hundreds of
// cgroups every second. What it returns is valid until its next read.
type fileReader struct {
	buf [8 << 10]byte // memory.stat, the longest file read, is 1-3 KB
}

// read reads dir/name. A missing file, or dir "" (a v1 controller that
// is not mounted), is an error matching fs.ErrNotExist.
func (r *fileReader) read(dir, name string) (b []byte, path string, err error) {
	if dir == "" {
		return nil, name, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	path = filepath.Join(dir, name)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, path, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b = r.buf[:0]
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, len(b))
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, path, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return b, path, nil
		}
		b = b[:len(b)+n]
	}
}

// uint reads a file of one number in dir; a missing file or dir (its
// controller is not there) is 0.
func (r *fileReader) uint(dir, name string) (uint64, error) {
	b, path, err := r.read(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
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

// keyValues reads a file of "key number" lines (memory.stat, cpu.stat) in
// dir into vals as parseKeyValues does; a missing file or dir has none of
// keys.
func (r *fileReader) keyValues(dir, name string, keys []string, vals []uint64) (found uint64, err error) {
	b, path, err := r.read(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return parseKeyValues(b, path, keys, vals)
}

// parseKeyValues sets vals[i] to the number on the "keys[i] number" line
// of b, the content of path; found has bit i set when b has keys[i]. A line
// of another form is an error: the file is not what it should be.
func parseKeyValues(b []byte, path string, keys []string, vals []uint64) (found uint64, err error) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, _ := bytes.Cut(line, []byte{' '})
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: line %q: %w", path, string(line), err)
		}
		for i, key := range keys {
			if string(k) == key {
				vals[i], found = n, found|1<<i
			}
		}
	}
	return found, nil
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
	var r fileReader
	n, _, err := m.memoryEvents(&r, dir)
	if err != nil {
		return false, fmt.Errorf("cgroup %s: %w", cgroupsPath, err)
	}
	return n > 0, nil
}

// memoryEvents reads the oom_kill counter, and on v2 the max one
// (memory.events). A file without oom_kill is an error, not zero: it means
// a kernel too old to tell, and guessing would hide OOM kills.
func (m *Manager) memoryEvents(r *fileReader, dir string) (oomKills, max uint64, err error) {
	file := "memory.events"
	if m.mode == V1 {
		file = "memory.oom_control"
	}
	b, path, err := r.read(dir, file)
	if err != nil {
		return 0, 0, err
	}
	var n [2]uint64
	found, err := parseKeyValues(b, path, []string{"oom_kill", "max"}, n[:])
	if err == nil && found&1 == 0 {
		err = fmt.Errorf("%s has no oom_kill counter (kernel older than 4.13?)", path)
	}
	return n[0], n[1], err
}
