package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestWeightToShares: every shares value's weight converts back to shares
// that give the same weight, and no fewer than it came from; the defaults
// and the ends come back exact.
func TestWeightToShares(t *testing.T) {
	for w, want := range map[uint64]uint64{0: 0, 1: 2, 100: 1024, 10000: 262144} {
		if got := WeightToShares(w); got != want {
			t.Errorf("WeightToShares(%d) = %d, want %d", w, got, want)
		}
	}
	for s := uint64(2); s <= 262144; s++ {
		w := SharesToWeight(s)
		back := WeightToShares(w)
		if SharesToWeight(back) != w || back < s {
			t.Fatalf("shares %d → weight %d → shares %d (weight %d)", s, w, back, SharesToWeight(back))
		}
	}
}

// TestV2FakeDetails reads every Details file of a unified cgroup, then the
// same cgroup without the files a host may lack.
func TestV2FakeDetails(t *testing.T) {
	root := fakeV2(t)
	m, err := newManager(Cgroupfs, root, V2)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "kubepods/pod1/c1")
	writeFiles(t, dir, map[string]string{
		"memory.stat":    "anon 3000000\nfile 4096\ninactive_file 1000000\npgfault 700\npgmajfault 7\nfile_mapped 8192\nkernel 65536\n",
		"memory.current": "5000000\n", "memory.peak": "6000000\n", "memory.max": "67108864\n",
		"memory.swap.current": "4096\n", "memory.swap.max": "max\n",
		"memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
		"cpu.stat":      "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 40\nnr_throttled 30\nthrottled_usec 2500000\n",
		"cpu.max":       "20000 100000\n", "cpu.weight": "100\n",
		"pids.current": "3\n", "pids.max": "max\n",
		"io.stat":      "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n253:1 rbytes=0 wbytes=512 rios=0 wios=1 dbytes=0 dios=0\n",
		"cgroup.procs": "17\n42\n",
	})
	got, err := m.Details("/kubepods/pod1/c1")
	if err != nil {
		t.Fatal(err)
	}
	want := Details{
		Stats:        wantStats,
		CPUUserNanos: 100000000, CPUSystemNanos: 23456000,
		CFSPeriods: 40, CFSThrottledPeriods: 30, CFSThrottledNanos: 2500000000,
		MemoryMappedFileBytes: 8192, MemoryFailcnt: 3, MemoryMaxUsageBytes: 6000000, MemoryKernelBytes: 65536,
		PidsLimit: 0,
		Spec:      Spec{CPUPeriodMicros: 100000, CPUQuotaMicros: 20000, CPUShares: 1024},
		IO: []DeviceIO{{Major: 8, Minor: 0, Device: DeviceName(8, 0), ReadBytes: 4096, WriteBytes: 8192, Reads: 1, Writes: 2},
			{Major: 253, Minor: 1, Device: DeviceName(253, 1), WriteBytes: 512, Writes: 1}},
		Procs: []int{17, 42},
		Has:   Has{CPUSpec: true, MemorySpec: true, Pids: true, MemoryPeak: true, KernelMemory: true, SwapLimit: true},
	}
	want.CPUUsageNanos, want.OOMKills = 123456000, 1
	want.MemoryLimitBytes, want.Swap = 64<<20, Swap{Accounted: true, UsedBytes: 4096}
	checkDetails(t, got, want)

	// A kernel before 5.18/5.19, no swap accounting, no cpu or pids
	// controller in the cgroup, no I/O yet: those figures are not there,
	// and Has says so.
	for _, f := range []string{"memory.peak", "memory.swap.current", "memory.swap.max", "cpu.max", "cpu.weight", "pids.current", "pids.max", "io.stat"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	writeFiles(t, dir, map[string]string{
		"memory.stat": "anon 3000000\nfile 4096\ninactive_file 1000000\npgfault 700\npgmajfault 7\nfile_mapped 8192\n",
		"cpu.stat":    "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
	})
	if got, err = m.Details("/kubepods/pod1/c1"); err != nil {
		t.Fatal(err)
	}
	if got.Has != (Has{MemorySpec: true}) || got.IO != nil || got.Spec.CPUShares != 0 || got.MemoryKernelBytes != 0 || got.Swap != (Swap{}) {
		t.Errorf("without the optional files: %+v", got)
	}
	if _, err := m.Details("/kubepods/gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Details of a missing cgroup: %v", err)
	}
}

// TestV1FakeDetails reads every Details file of a cgroup of the v1
// hierarchies.
func TestV1FakeDetails(t *testing.T) {
	root := fakeV1(t)
	writeV1Cgroup(t, root, "/kubepods/pod1/c1", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
	rel := "kubepods/pod1/c1"
	writeFiles(t, filepath.Join(root, "memory", rel), map[string]string{
		"memory.stat": "cache 100\nrss 50\ninactive_file 10\npgfault 5\npgmajfault 1\nmapped_file 1\nswap 2\n" +
			"total_cache 4096\ntotal_rss 3000000\ntotal_inactive_file 1000000\ntotal_pgfault 700\ntotal_pgmajfault 7\n" +
			"total_mapped_file 8192\ntotal_swap 4096\n",
		"memory.failcnt": "5\n", "memory.kmem.usage_in_bytes": "65536\n", "memory.limit_in_bytes": "67108864\n",
		"memory.memsw.limit_in_bytes": "134217728\n", "cgroup.procs": "17\n",
	})
	writeFiles(t, filepath.Join(root, "cpu,cpuacct", rel), map[string]string{
		"cpu.cfs_period_us": "100000\n", "cpu.cfs_quota_us": "-1\n", "cpu.shares": "512\n",
	})
	writeFiles(t, filepath.Join(root, "pids", rel), map[string]string{"pids.max": "100\n"})
	writeFiles(t, filepath.Join(root, "blkio", rel), map[string]string{
		"blkio.throttle.io_service_bytes_recursive": "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Async 12288\n8:0 Discard 0\n8:0 Total 12288\nTotal 12288\n",
		"blkio.throttle.io_serviced_recursive":      "8:0 Read 1\n8:0 Write 2\n8:0 Sync 0\n8:0 Async 3\n8:0 Discard 0\n8:0 Total 3\nTotal 3\n",
	})
	m, err := newManager(Cgroupfs, root, V1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Details("/" + rel)
	if err != nil {
		t.Fatal(err)
	}
	want := Details{
		Stats:        wantStats,
		CPUUserNanos: 100000000, CPUSystemNanos: 50000000, // 10 and 5 ticks of 10 ms
		CFSPeriods: 4, CFSThrottledPeriods: 1, CFSThrottledNanos: 99,
		MemoryMappedFileBytes: 8192, MemoryFailcnt: 5, MemoryMaxUsageBytes: 6000000, MemoryKernelBytes: 65536,
		PidsLimit: 100,
		Spec:      Spec{CPUPeriodMicros: 100000, CPUShares: 512, MemorySwapLimitBytes: 128 << 20},
		IO:        []DeviceIO{{Major: 8, Minor: 0, Device: DeviceName(8, 0), ReadBytes: 4096, WriteBytes: 8192, Reads: 1, Writes: 2}},
		Procs:     []int{17},
		Has:       Has{CPUSpec: true, MemorySpec: true, Pids: true, MemoryPeak: true, KernelMemory: true, SwapLimit: true},
	}
	want.OOMKills = 2
	// memsw is memory and swap together: 64 MiB of swap beside 64 MiB.
	want.MemoryLimitBytes, want.Swap = 64<<20, Swap{Accounted: true, UsedBytes: 4096, LimitBytes: 64 << 20, Limited: true}
	checkDetails(t, got, want)
}

// TestLimitFile reads limits as v1 and v2 write them: a swap limit of 0
// (the kubelet's for a container allowed no swap) is a limit, "max" and
// v1's largest page-aligned number are none.
func TestLimitFile(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]limitFile{
		"0\n":                   {found: true, limited: true},
		"67108864\n":            {found: true, limited: true, value: 64 << 20},
		"max\n":                 {found: true},
		"9223372036854771712\n": {found: true},
	} {
		writeFiles(t, dir, map[string]string{"memory.swap.max": content})
		var r fileReader
		got, err := r.limit(dir, "memory.swap.max")
		if err != nil || got.found != want.found || got.limited != want.limited || got.zeroIfNone() != want.value {
			t.Errorf("limit of %q = %+v, %v; want %+v", content, got, err, want)
		}
	}
	var r fileReader
	if got, err := r.limit(dir, "memory.missing"); err != nil || got != (limitFile{}) {
		t.Errorf("limit of a missing file = %+v, %v", got, err)
	}
}

func checkDetails(t *testing.T, got, want Details) {
	t.Helper()
	if got.Timestamp.IsZero() {
		t.Error("no timestamp")
	}
	got.Timestamp = want.Timestamp
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Details\n got %+v\nwant %+v", got, want)
	}
}

// TestParseIO: the devices' lines, and lines that are not.
func TestParseIO(t *testing.T) {
	if _, err := parseIOStat([]byte("8:0 rbytes=x\n"), "io.stat"); err == nil {
		t.Error("io.stat with a bad number accepted")
	}
	if _, err := parseIOStat([]byte("sda rbytes=1\n"), "io.stat"); err == nil || !strings.Contains(err.Error(), "no device number") {
		t.Errorf("io.stat without a device number: %v", err)
	}
	got, err := parseIOStat([]byte("\n8:16 rbytes=1 newkey=7\n"), "io.stat")
	if err != nil || len(got) != 1 || got[0].ReadBytes != 1 || got[0].Minor != 16 {
		t.Errorf("io.stat with a key berth does not know: %+v, %v", got, err)
	}
	rb := func(io *DeviceIO) *uint64 { return &io.ReadBytes }
	wb := func(io *DeviceIO) *uint64 { return &io.WriteBytes }
	if _, err := parseBlkioV1([]byte("8:0 Read many\n"), "blkio", nil, rb, wb); err == nil {
		t.Error("blkio with a bad number accepted")
	}
	got, err = parseBlkioV1([]byte("8:0 Read 1\n8:16 Write 2\n8:0 Write 3\nTotal 6\n"), "blkio", nil, rb, wb)
	if err != nil || len(got) != 2 || got[0].ReadBytes != 1 || got[0].WriteBytes != 3 || got[1].WriteBytes != 2 {
		t.Errorf("blkio of two devices: %+v, %v", got, err)
	}
}
