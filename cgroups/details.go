package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strconv"
	"sync"
)

// Details are what the CRI metrics report of a container's cgroup beyond
// Stats: cadvisor's figures, as cadvisor reads them (its libcontainer
// handler and GetSpec), save where noted. The metrics read them on request,
// every file once (see Manager.Details); the collector's per-second sample
// stays Stats alone.
type Details struct {
	Stats
	CPUUserNanos, CPUSystemNanos uint64 // v2 cpu.stat user_usec and system_usec; v1 cpuacct.stat, in clock ticks
	// CFS bandwidth control (cpu.stat): periods elapsed, those throttled,
	// and the time throttled. The kernel counts them while a quota is set.
	CFSPeriods, CFSThrottledPeriods, CFSThrottledNanos uint64
	MemoryMappedFileBytes                              uint64 // memory.stat file_mapped (v1 mapped_file)
	// MemoryFailcnt is v1's memory.failcnt: how often usage hit the limit.
	// v2 has no such file; its nearest is memory.events' max, how often
	// usage was about to pass memory.max (runc's library leaves it 0, and
	// so cadvisor does: a 0 that says nothing).
	MemoryFailcnt uint64
	// MemoryMaxUsageBytes is the usage's high-water mark: v1
	// memory.max_usage_in_bytes, v2 memory.peak (Linux 5.19+: Has.MemoryPeak).
	MemoryMaxUsageBytes uint64
	// MemoryKernelBytes is the kernel's memory charged to the cgroup: v1
	// memory.kmem.usage_in_bytes, v2 memory.stat's kernel (Linux 5.18+; on
	// v2 runc's library, and so cadvisor, leave it 0). Has.KernelMemory.
	MemoryKernelBytes uint64
	// PidsLimit is pids.max; 0 is no limit, as cadvisor reports "max".
	PidsLimit uint64
	// The limits the cgroup has now (cadvisor's ContainerSpec), read from
	// it rather than from the CRI request: UpdateContainerResources and
	// the kernel's defaults are in them.
	Spec Spec
	// IO is per block device, as the blkio controller counts it: v2
	// io.stat, v1 the blkio.throttle.io_service{d,_bytes}_recursive files
	// (those count every request, whatever the I/O scheduler).
	IO []DeviceIO
	// Procs are the cgroup's processes (cgroup.procs), as the host numbers
	// them.
	Procs []int
	Has   Has // which of the figures that a host may lack were found
}

// Spec is a cgroup's limits beyond Stats' memory limit. A swap limit of 0
// is none, as cadvisor reports it.
type Spec struct {
	// CPUPeriodMicros is the CFS period (v2 cpu.max's second field, v1
	// cpu.cfs_period_us); CPUQuotaMicros the quota in it, 0 for none.
	CPUPeriodMicros, CPUQuotaMicros uint64
	// CPUShares is v1 cpu.shares; on v2, cpu.weight converted back to
	// shares (WeightToShares).
	CPUShares uint64
	// MemorySwapLimitBytes is v2 memory.swap.max, swap alone, and v1
	// memory.memsw.limit_in_bytes, memory and swap together, as cadvisor
	// reads each (Has.SwapLimit: only with swap accounting).
	MemorySwapLimitBytes uint64
}

// Has says which figures a host may lack were read.
type Has struct {
	CPUSpec      bool // v2: the cpu controller is enabled in the cgroup
	MemorySpec   bool // the memory limit was read
	Pids         bool // the pids controller
	MemoryPeak   bool
	KernelMemory bool
	SwapLimit    bool
}

// DeviceIO is one block device's I/O: bytes and requests (completed) read
// and written.
type DeviceIO struct {
	Major, Minor                         uint32
	Device                               string // /dev/<name>; "" if the kernel names none
	ReadBytes, WriteBytes, Reads, Writes uint64
}

// Details reads Stats and Details of the cgroup at cgroupsPath in one pass,
// each file once: some twenty files, so on request only (the CRI metrics),
// never in the collector's sampling. A missing cgroup is an error that
// matches os.ErrNotExist.
func (m *Manager) Details(cgroupsPath string) (Details, error) {
	return m.read(cgroupsPath, true)
}

// readV2 reads the files of Details that Stats does not read, of the
// unified cgroup at dir.
func (d *Details) readV2(r *fileReader, dir string) error {
	// cpu.max and cpu.weight are there where the cpu controller is enabled.
	if b, path, err := r.read(dir, "cpu.max"); err == nil {
		// "max 100000" or "20000 100000".
		quota, period, _ := bytes.Cut(bytes.TrimSpace(b), []byte{' '})
		if d.Spec.CPUPeriodMicros, err = strconv.ParseUint(string(period), 10, 64); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if string(quota) != "max" {
			if d.Spec.CPUQuotaMicros, err = strconv.ParseUint(string(quota), 10, 64); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
		w, err := r.uint(dir, "cpu.weight")
		if err != nil {
			return err
		}
		d.Spec.CPUShares, d.Has.CPUSpec = WeightToShares(w), true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var err error
	if d.MemoryMaxUsageBytes, d.Has.MemoryPeak, err = r.optional(dir, "memory.peak"); err != nil {
		return err
	}
	if err := d.readPidsLimit(r, dir); err != nil {
		return err
	}
	if b, path, err := r.read(dir, "io.stat"); err == nil {
		if d.IO, err = parseIOStat(b, path); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return d.readProcs(r, dir)
}

// readV1 reads the files of Details that Stats does not read, of a cgroup
// of the v1 hierarchies (a dir "" is a controller not mounted).
func (d *Details) readV1(r *fileReader, cpuDir, cpuacctDir, memDir, pidsDir, blkioDir string) error {
	var ticks [2]uint64
	if _, err := r.keyValues(cpuacctDir, "cpuacct.stat", []string{"user", "system"}, ticks[:]); err != nil {
		return err
	}
	// In USER_HZ, which Linux fixes at 100 for every architecture's user
	// space (sysconf(_SC_CLK_TCK)), as runc converts them.
	d.CPUUserNanos, d.CPUSystemNanos = ticks[0]*1e9/100, ticks[1]*1e9/100
	var cfs [3]uint64
	if _, err := r.keyValues(cpuDir, "cpu.stat", []string{"nr_periods", "nr_throttled", "throttled_time"}, cfs[:]); err != nil {
		return err
	}
	d.CFSPeriods, d.CFSThrottledPeriods, d.CFSThrottledNanos = cfs[0], cfs[1], cfs[2]
	var err error
	if d.Spec.CPUPeriodMicros, d.Has.CPUSpec, err = r.optional(cpuDir, "cpu.cfs_period_us"); err != nil {
		return err
	}
	if d.Has.CPUSpec {
		b, path, err := r.read(cpuDir, "cpu.cfs_quota_us")
		if err != nil {
			return err
		}
		q, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		d.Spec.CPUQuotaMicros = uint64(max(q, 0)) // -1: none
		if d.Spec.CPUShares, err = r.uint(cpuDir, "cpu.shares"); err != nil {
			return err
		}
	}
	if d.MemoryMaxUsageBytes, d.Has.MemoryPeak, err = r.optional(memDir, "memory.max_usage_in_bytes"); err != nil {
		return err
	}
	if d.MemoryFailcnt, err = r.uint(memDir, "memory.failcnt"); err != nil {
		return err
	}
	if d.MemoryKernelBytes, d.Has.KernelMemory, err = r.optional(memDir, "memory.kmem.usage_in_bytes"); err != nil {
		return err
	}
	if err := d.readPidsLimit(r, pidsDir); err != nil {
		return err
	}
	if err := d.readBlkioV1(r, blkioDir); err != nil {
		return err
	}
	return d.readProcs(r, memDir)
}

// readBlkioV1 reads the v1 blkio counters of bytes and of requests.
func (d *Details) readBlkioV1(r *fileReader, dir string) error {
	for _, f := range []struct {
		name        string
		read, write func(*DeviceIO) *uint64
	}{
		{"blkio.throttle.io_service_bytes_recursive", func(io *DeviceIO) *uint64 { return &io.ReadBytes }, func(io *DeviceIO) *uint64 { return &io.WriteBytes }},
		{"blkio.throttle.io_serviced_recursive", func(io *DeviceIO) *uint64 { return &io.Reads }, func(io *DeviceIO) *uint64 { return &io.Writes }},
	} {
		b, path, err := r.read(dir, f.name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.IO, err = parseBlkioV1(b, path, d.IO, f.read, f.write); err != nil {
			return err
		}
	}
	return nil
}

// readPidsLimit reads pids.max of the pids cgroup at dir, where the
// controller is there.
func (d *Details) readPidsLimit(r *fileReader, dir string) error {
	l, err := r.limit(dir, "pids.max")
	d.PidsLimit, d.Has.Pids = l.zeroIfNone(), l.found
	return err
}

// readProcs lists the processes of the cgroup at dir.
func (d *Details) readProcs(r *fileReader, dir string) error {
	b, path, err := r.read(dir, "cgroup.procs")
	if err != nil {
		return err
	}
	for f := range bytes.FieldsSeq(b) {
		pid, err := strconv.Atoi(string(f))
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		d.Procs = append(d.Procs, pid)
	}
	return nil
}

// optional reads a file of one number that a host may lack: ok is false
// where it is missing.
func (r *fileReader) optional(dir, name string) (v uint64, ok bool, err error) {
	b, path, err := r.read(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if v, err = strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64); err != nil {
		return 0, false, fmt.Errorf("%s: %w", path, err)
	}
	return v, true, nil
}

// noLimit is where cadvisor stops taking a memory limit for one: v1 writes
// "no limit" as the largest page-aligned int64, v2 as "max".
const noLimit = 1 << 62

// limitFile is a limit file's figure: found where the file is there,
// limited where it sets a limit ("max", or on v1 a value past noLimit, is
// none), and then value.
type limitFile struct {
	found, limited bool
	value          uint64
}

// zeroIfNone is the limit as cadvisor reports it: 0 for none.
func (l limitFile) zeroIfNone() uint64 {
	if !l.limited {
		return 0
	}
	return l.value
}

// limit reads a limit file that a host may lack.
func (r *fileReader) limit(dir, name string) (limitFile, error) {
	b, path, err := r.read(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return limitFile{}, nil
	}
	if err != nil {
		return limitFile{}, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return limitFile{found: true}, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return limitFile{}, fmt.Errorf("%s: %w", path, err)
	}
	return limitFile{found: true, limited: v <= noLimit, value: v}, nil
}

// parseIOStat reads v2 io.stat: a line per device, "MAJ:MIN rbytes=N
// wbytes=N rios=N wios=N dbytes=N dios=N" (keys a kernel adds are ignored).
func parseIOStat(b []byte, path string) ([]DeviceIO, error) {
	var out []DeviceIO
	for line := range bytes.Lines(b) {
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		io, err := deviceIO(fields[0], path)
		if err != nil {
			return nil, err
		}
		for _, kv := range fields[1:] {
			k, v, _ := bytes.Cut(kv, []byte{'='})
			var dst *uint64
			switch string(k) {
			case "rbytes":
				dst = &io.ReadBytes
			case "wbytes":
				dst = &io.WriteBytes
			case "rios":
				dst = &io.Reads
			case "wios":
				dst = &io.Writes
			default:
				continue
			}
			if *dst, err = strconv.ParseUint(string(v), 10, 64); err != nil {
				return nil, fmt.Errorf("%s: line %q: %w", path, bytes.TrimSpace(line), err)
			}
		}
		out = append(out, io)
	}
	return out, nil
}

// parseBlkioV1 adds a v1 blkio file's Read and Write lines ("MAJ:MIN Read
// N"; also Write, Sync, Async, Discard, Total, and a last "Total N") to
// the devices of ios.
func parseBlkioV1(b []byte, path string, ios []DeviceIO, read, write func(*DeviceIO) *uint64) ([]DeviceIO, error) {
	for line := range bytes.Lines(b) {
		fields := bytes.Fields(line)
		if len(fields) != 3 {
			continue // the node-wide "Total N"
		}
		var dst func(*DeviceIO) *uint64
		switch string(fields[1]) {
		case "Read":
			dst = read
		case "Write":
			dst = write
		default:
			continue
		}
		io, err := deviceIO(fields[0], path)
		if err != nil {
			return nil, err
		}
		n, err := strconv.ParseUint(string(fields[2]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: line %q: %w", path, bytes.TrimSpace(line), err)
		}
		i := 0
		for i < len(ios) && (ios[i].Major != io.Major || ios[i].Minor != io.Minor) {
			i++
		}
		if i == len(ios) {
			ios = append(ios, io)
		}
		*dst(&ios[i]) = n
	}
	return ios, nil
}

// deviceIO is a DeviceIO for "MAJ:MIN", named.
func deviceIO(majMin []byte, path string) (DeviceIO, error) {
	maj, min, ok := bytes.Cut(majMin, []byte{':'})
	ma, err1 := strconv.ParseUint(string(maj), 10, 32)
	mi, err2 := strconv.ParseUint(string(min), 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return DeviceIO{}, fmt.Errorf("%s: %q is no device number", path, majMin)
	}
	return DeviceIO{Major: uint32(ma), Minor: uint32(mi), Device: DeviceName(uint32(ma), uint32(mi))}, nil
}

// deviceNames caches DeviceName: a node has few block devices, and the
// metrics ask for each at every call.
var deviceNames sync.Map // "maj:min" → string

// DeviceName is the /dev name of a block device, from its DEVNAME in
// sysfs, as cadvisor labels devices; "" when sysfs names none.
func DeviceName(major, minor uint32) string {
	key := strconv.FormatUint(uint64(major), 10) + ":" + strconv.FormatUint(uint64(minor), 10)
	if n, ok := deviceNames.Load(key); ok {
		return n.(string)
	}
	name := ""
	if b, err := os.ReadFile("/sys/dev/block/" + key + "/uevent"); err == nil {
		for line := range bytes.Lines(b) {
			if v, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("DEVNAME=")); ok {
				name = "/dev/" + string(v)
			}
		}
	}
	deviceNames.Store(key, name)
	return name
}

// WeightToShares converts a v2 cpu.weight back to the v1 cpu.shares that
// SharesToWeight makes it from: the largest shares that give the weight,
// which is the shares exactly for the defaults and the ends (100→1024,
// 1→2, 10000→262144), and near it elsewhere (the weight has fewer values).
// cadvisor inverts the linear conversion runc used before 1.3 instead,
// and so reports 2597 for a container of 1024 shares; berth's weights are
// made with the quadratic one, and its inverse gives the shares back.
func WeightToShares(weight uint64) uint64 {
	switch {
	case weight == 0:
		return 0
	case weight >= 10000:
		return 262144
	}
	// SharesToWeight: w = ceil(10^((l²+125l)/612 − 7/34)), l = log2(shares).
	// Solved for l: the largest shares whose weight is w or less.
	e := math.Log10(float64(weight)) + 7.0/34.0
	l := (-125 + math.Sqrt(125*125+4*612*e)) / 2
	// Rounding must not take the defaults below their shares (1024 is
	// 2^10 exactly): a hair above is still shares that give weight.
	s := uint64(math.Floor(math.Pow(2, l) + 1e-6))
	return max(s, 2)
}
