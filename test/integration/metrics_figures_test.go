package integration

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/test/harness"
)

// workerThreads is how many threads the metered program (testdata/metered)
// holds besides its own.
const workerThreads = 8

// buildMetered returns the metered program (testdata/metered), static:
// the binary BERTH_METERED_BIN names (the VM tier's, built on the host),
// or one built here.
func buildMetered(t *testing.T) []byte {
	t.Helper()
	bin := os.Getenv("BERTH_METERED_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "metered")
		build := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/metered")
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build the metered program: %v\n%s", err, out)
		}
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCRIMetricsFigures runs a container that real programs make known
// figures of (threads, a socket, a CPU quota it runs into, a memory limit,
// traffic on the pod's interface) and checks each of cadvisor's series
// in ListPodSandboxMetrics against them: the values, not just the names.
func TestCRIMetricsFigures(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	img := e.reg.Push(t, "berth/busybox:metered", harness.BusyboxImage(t, harness.ImageSpec{
		Layers: [][]harness.File{{{Path: "metered", Content: buildMetered(t), Mode: 0o755}}},
	}))
	mustPull(t, e.d, img.Name, img.ID)

	cfg := e.podConfig("figures")
	pod := e.runPod(t, cfg)
	cc := e.ctrConfig("metered", "/metered", strconv.Itoa(workerThreads))
	cc.Image = &runtimeapi.ImageSpec{Image: img.Name}
	cc.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 10000, CpuShares: 512, MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 128 << 20}}
	before := time.Now().Truncate(time.Second)
	ctr := e.runContainer(t, pod, cfg, cc)

	// Traffic on the pod's eth0: a connection from the host to the
	// program's listener.
	ip := e.podIP(t, pod)
	if !eventually(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		t.Fatalf("no connection to the metered program at %s:8080", ip)
	}

	keys := e.metricLabelKeys(t)
	// series maps each series, named with its labels beyond the common
	// ones ("container_memory_failures_total{pgfault,container}"), to its
	// value.
	var series map[string]uint64
	read := func() {
		list, err := e.d.Runtime.ListPodSandboxMetrics(t.Context(), &runtimeapi.ListPodSandboxMetricsRequest{})
		if err != nil || len(list.PodMetrics) != 1 || len(list.PodMetrics[0].ContainerMetrics) != 1 {
			t.Fatalf("ListPodSandboxMetrics = %v, %v; want one pod with one container", list, err)
		}
		series = map[string]uint64{}
		pm := list.PodMetrics[0]
		for _, m := range append(pm.Metrics, pm.ContainerMetrics[0].Metrics...) {
			if len(m.LabelValues) != len(keys[m.Name]) {
				t.Fatalf("%s: %d label values for %d keys", m.Name, len(m.LabelValues), len(keys[m.Name]))
			}
			name := m.Name
			if extra := m.LabelValues[len(criLabelKeys):]; len(extra) > 0 {
				name += "{" + strings.Join(extra, ",") + "}"
			}
			series[name] = m.Value.GetValue()
		}
	}
	// The quota throttles the spinning thread within a period or two;
	// a whole second of throttling takes a little over one. Under the
	// quota, and in the VM tier's emulation, the program's threads start
	// slowly too.
	if !eventually(90*time.Second, func() bool {
		read()
		return series["container_cpu_cfs_throttled_seconds_total"] >= 1 && series["container_network_receive_packets_total{eth0}"] > 0 &&
			series["container_threads"] >= workerThreads+1
	}) {
		t.Errorf("throttled %d s, eth0 received %d packets, %d threads: want ≥ 1, > 0, ≥ %d",
			series["container_cpu_cfs_throttled_seconds_total"], series["container_network_receive_packets_total{eth0}"],
			series["container_threads"], workerThreads+1)
	}

	mode := cgroups.DetectMode()
	shares, swapLimit := uint64(512), uint64(128<<20) // v1: memory and swap together
	if mode == cgroups.V2 {
		// The weight runc made of 512 shares, back; swap.max is swap alone.
		shares, swapLimit = cgroups.WeightToShares(cgroups.SharesToWeight(512)), 64<<20
	}
	exact := map[string]uint64{
		"container_processes":               1,
		"container_spec_cpu_period":         100000,
		"container_spec_cpu_quota":          10000,
		"container_spec_cpu_shares":         shares,
		"container_spec_memory_limit_bytes": 64 << 20,
	}
	if _, ok := series["container_spec_memory_swap_limit_bytes"]; ok {
		exact["container_spec_memory_swap_limit_bytes"] = swapLimit
	}
	for s, want := range exact {
		if got, ok := series[s]; !ok || got != want {
			t.Errorf("%s = %d (listed: %v), want %d", s, got, ok, want)
		}
	}
	atLeast := map[string]uint64{
		"container_threads":                                  workerThreads + 1,
		"container_file_descriptors":                         4, // stdio, the listener, the poller
		"container_sockets":                                  1,
		"container_cpu_cfs_periods_total":                    1,
		"container_cpu_cfs_throttled_periods_total":          1,
		"container_memory_failures_total{pgfault,container}": 1,
		"container_memory_failures_total{pgfault,hierarchy}": 1,
		"container_memory_max_usage_bytes":                   series["container_memory_usage_bytes"],
		"container_network_transmit_packets_total{eth0}":     1,
		"container_start_time_seconds":                       uint64(before.Unix()),
		"container_last_seen":                                uint64(time.Now().Add(-time.Minute).Unix()),
	}
	for s, want := range atLeast {
		if got, ok := series[s]; !ok || got < want {
			t.Errorf("%s = %d (listed: %v), want ≥ %d", s, got, ok, want)
		}
	}
	// Listed with the figures the kernel keeps for any container.
	for _, s := range []string{"container_cpu_user_seconds_total", "container_cpu_system_seconds_total", "container_memory_failcnt",
		"container_memory_mapped_file", "container_memory_kernel_usage", "container_threads_max",
		"container_memory_failures_total{pgmajfault,container}", "container_memory_failures_total{pgmajfault,hierarchy}",
		"container_network_receive_packets_dropped_total{eth0}", "container_network_transmit_packets_dropped_total{eth0}"} {
		if _, ok := series[s]; !ok {
			t.Errorf("%s not listed", s)
		}
	}
	if series["container_cpu_user_seconds_total"]+series["container_cpu_system_seconds_total"] > series["container_cpu_usage_seconds_total"]+1 {
		t.Errorf("user %d s + system %d s > usage %d s", series["container_cpu_user_seconds_total"],
			series["container_cpu_system_seconds_total"], series["container_cpu_usage_seconds_total"])
	}
	// The writable layer's filesystem, by its device.
	var fsDevice string
	for s, v := range series {
		if dev, ok := strings.CutPrefix(s, "container_fs_limit_bytes{"); ok {
			fsDevice = strings.TrimSuffix(dev, "}")
			if v == 0 || series["container_fs_inodes_free{"+fsDevice+"}"] == 0 {
				t.Errorf("filesystem %q: size %d, free inodes %d; want both > 0", fsDevice, v, series["container_fs_inodes_free{"+fsDevice+"}"])
			}
		}
	}
	if fsDevice == "" {
		t.Errorf("no container_fs_limit_bytes in %v", series)
	}
	// Block I/O is listed per device the container's requests reached:
	// none where the layer is on tmpfs, and writeback is not the
	// container's on v1. Each device listed has its four counters.
	for s := range series {
		if dev, ok := strings.CutPrefix(s, "container_fs_reads_bytes_total{"); ok {
			dev = strings.TrimSuffix(dev, "}")
			for _, c := range []string{"container_fs_reads_total", "container_fs_writes_bytes_total", "container_fs_writes_total"} {
				if _, ok := series[c+"{"+dev+"}"]; !ok {
					t.Errorf("device %q: %s not listed", dev, c)
				}
			}
		}
	}
	checkMemoryAvailable(t, containerStats(t, e, ctr), series)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// checkMemoryAvailable checks the stats of TestCRIMetricsFigures'
// container, 64 MiB of memory and 64 MiB of swap beside it: the memory its
// working set leaves of the limit, and where the host accounts swap (the
// metrics list the swap used), the swap used and what is left of its limit.
func checkMemoryAvailable(t *testing.T, st *runtimeapi.ContainerStats, series map[string]uint64) {
	t.Helper()
	m := st.GetMemory()
	if ws, avail := m.GetWorkingSetBytes().GetValue(), m.GetAvailableBytes(); ws == 0 || avail == nil || avail.Value != 64<<20-ws {
		t.Errorf("memory %v: want available bytes, the 64 MiB limit less the working set", m)
	}
	swap := st.GetSwap()
	if _, accounted := series["container_memory_swap"]; !accounted {
		if swap != nil {
			t.Errorf("swap %v where the host accounts none", swap)
		}
		return
	}
	if used, avail := swap.GetSwapUsageBytes(), swap.GetSwapAvailableBytes(); used == nil || avail == nil || avail.Value != 64<<20-used.Value || swap.Timestamp == 0 {
		t.Errorf("swap %v: want its usage, time, and available the 64 MiB of swap less the usage", swap)
	}
}

// criLabelKeys are the labels every series of a container or pod starts
// with.
var criLabelKeys = []string{"id", "name", "image", "pod", "namespace", "container"}
