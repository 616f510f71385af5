package cgroups

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The tests in this file assert the real cgroup v2 files of pods and
// containers. They run in the VM tier (test/vm, `make test-vm`), whose init
// sets BERTH_VM=1 and mounts cgroup2 unified at /sys/fs/cgroup with every
// controller delegated; elsewhere they skip. Inside the VM anything but v2
// is a failure, not a skip: a broken detection must not pass quietly.
func requireV2VM(t *testing.T) (*Manager, string) {
	t.Helper()
	if os.Getenv("BERTH_VM") != "1" {
		t.Skip("cgroup v2 VM test: runs in the VM tier only (make test-vm sets BERTH_VM=1 there)")
	}
	if got := DetectMode(); got != V2 {
		t.Fatalf("BERTH_VM=1 but DetectMode() = %v: the VM mounts cgroup2 unified at %s", got, defaultRoot)
	}
	m, parent := realManager(t)
	if m.Mode() != V2 {
		t.Fatalf("New(cgroupfs).Mode() = %v on a unified host", m.Mode())
	}
	return m, parent
}

// v2Controllers are the controllers berth's resources need; the VM's
// kernel (Debian's) offers all of them.
var v2Controllers = []string{"cpu", "cpuset", "memory", "pids", "io", "hugetlb"}

func fields(t *testing.T, p string) []string {
	t.Helper()
	return strings.Fields(readFile(t, p))
}

// TestV2PodAndContainerFiles creates a pod cgroup where the kubelet's
// cgroupfs driver puts it (…/kubepods/burstable/pod<uid>) and a container
// cgroup under it, puts a process in the container and checks every v2 file
// CRI resources map to, the delegation of controllers down the tree, the
// stats, an update of the resources, and removal.
func TestV2PodAndContainerFiles(t *testing.T) {
	m, parent := requireV2VM(t)
	pod := m.PodCgroup(parent+"/kubepods/burstable/pod0b1c", "0b1c")
	if want := parent + "/kubepods/burstable/pod0b1c"; pod != want {
		t.Fatalf("PodCgroup = %q, want the kubelet's cgroup_parent %q", pod, want)
	}
	if !m.caps.swap || !m.caps.hugetlb {
		t.Errorf("caps %+v: the VM's kernel has swap accounting and the hugetlb controller", m.caps)
	}
	res := &runtimeapi.LinuxContainerResources{
		CpuShares: 1024, CpuQuota: 50000, CpuPeriod: 100000,
		MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 96 << 20,
		CpusetCpus: "0-1", CpusetMems: "0",
		HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: 4 << 20}},
		Unified:        map[string]string{"memory.high": "50331648", "pids.max": "100"},
	}
	if err := m.CreatePod(pod, res); err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(defaultRoot, pod)

	// Every ancestor delegates the controllers, down to the pod.
	rootCtrls := fields(t, filepath.Join(defaultRoot, "cgroup.controllers"))
	for _, c := range v2Controllers {
		if !slices.Contains(rootCtrls, c) {
			t.Errorf("the VM's root cgroup lacks the %s controller (%v)", c, rootCtrls)
		}
	}
	for d := filepath.Dir(podDir); ; d = filepath.Dir(d) {
		sub := fields(t, filepath.Join(d, "cgroup.subtree_control"))
		for _, c := range rootCtrls {
			if !slices.Contains(sub, c) {
				t.Errorf("%s/cgroup.subtree_control = %v: %s not delegated", d, sub, c)
			}
		}
		if d == defaultRoot {
			break
		}
	}
	if got := fields(t, filepath.Join(podDir, "cgroup.controllers")); !containsAll(got, v2Controllers) {
		t.Errorf("pod cgroup.controllers = %v, want %v", got, v2Controllers)
	}

	wantPod := map[string]string{
		"cpu.weight":      "100", // 1024 shares, the kubelet's conversion
		"cpu.max":         "50000 100000",
		"memory.max":      strconv.Itoa(64 << 20),
		"memory.swap.max": strconv.Itoa(32 << 20), // CRI's limit is memory+swap
		"cpuset.cpus":     "0-1",
		"cpuset.mems":     "0",
		"hugetlb.2MB.max": strconv.Itoa(4 << 20),
		"memory.high":     "50331648",
		"pids.max":        "100",
	}
	checkFiles(t, podDir, wantPod)

	// A container cgroup made as runc makes it, with kubelet's pids limit.
	ctr := m.ContainerCgroupsPath(pod, "c0ffee")
	ctrDir := filepath.Join(defaultRoot, ctr)
	if err := m.create(ctr, &runtimeapi.LinuxContainerResources{
		CpuShares: 2, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 32 << 20, MemorySwapLimitInBytes: 32 << 20,
	}, 64); err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(ctrDir) != podDir {
		t.Errorf("container cgroup %s is not a child of the pod's %s", ctrDir, podDir)
	}
	if got := fields(t, filepath.Join(podDir, "cgroup.subtree_control")); !containsAll(got, v2Controllers) {
		t.Errorf("pod cgroup.subtree_control = %v after a container, want %v", got, v2Controllers)
	}
	checkFiles(t, ctrDir, map[string]string{
		"cpu.weight":      "1",
		"cpu.max":         "max 100000",
		"memory.max":      strconv.Itoa(32 << 20),
		"memory.swap.max": "0",
		"pids.max":        "64",
	})

	h := startHelper(t, "hold")
	moveTo(t, m, ctr, h.cmd.Process.Pid)
	h.start(t)
	if line, err := h.out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	pid := strconv.Itoa(h.cmd.Process.Pid)
	if got := fields(t, filepath.Join(ctrDir, "cgroup.procs")); !slices.Contains(got, pid) {
		t.Errorf("container cgroup.procs = %v, want %s", got, pid)
	}
	if got := readFile(t, "/proc/"+pid+"/cgroup"); got != "0::"+ctr {
		t.Errorf("/proc/%s/cgroup = %q, want %q", pid, got, "0::"+ctr)
	}
	st, err := m.Stats(ctr)
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := strconv.ParseUint(readFile(t, filepath.Join(ctrDir, "memory.current")), 10, 64)
	pids, _ := strconv.ParseUint(readFile(t, filepath.Join(ctrDir, "pids.current")), 10, 64)
	t.Logf("Stats(%s) = %+v; memory.current %d, pids.current %d", ctr, st, cur, pids)
	if st.MemoryUsageBytes < 8<<20 || st.MemoryRSSBytes < 8<<20 || st.Pids < 1 || st.CPUUsageNanos == 0 || st.OOMKills != 0 {
		t.Errorf("Stats(%s) = %+v: want the helper's 8 MiB, its threads and some CPU", ctr, st)
	}
	if st.Pids != pids {
		t.Errorf("Stats.Pids = %d, pids.current = %d", st.Pids, pids)
	}
	if pst, err := m.Stats(pod); err != nil || pst.MemoryUsageBytes < 8<<20 || pst.Pids < st.Pids {
		t.Errorf("pod Stats = %+v, %v: want the container's usage counted in", pst, err)
	}

	// Resources change in place (what UpdateContainerResources does to a
	// running container's cgroup through runc's same v2 writer).
	res.CpuShares, res.CpuQuota, res.MemoryLimitInBytes, res.MemorySwapLimitInBytes = 512, 20000, 128<<20, 128<<20
	res.Unified = map[string]string{"memory.high": "max"}
	if err := m.create(pod, res, 0); err != nil { // CreatePod would keep an existing cgroup's limits
		t.Fatal(err)
	}
	wantPod["cpu.weight"] = strconv.FormatUint(SharesToWeight(512), 10)
	wantPod["cpu.max"] = "20000 100000"
	wantPod["memory.max"] = strconv.Itoa(128 << 20)
	wantPod["memory.swap.max"] = "0"
	wantPod["memory.high"] = "max"
	checkFiles(t, podDir, wantPod)
	if got := fields(t, filepath.Join(ctrDir, "cgroup.procs")); !slices.Contains(got, pid) {
		t.Errorf("the update moved the process out: cgroup.procs = %v", got)
	}

	if err := m.RemovePod(pod); err == nil || !strings.Contains(err.Error(), pid) {
		t.Errorf("RemovePod with a live process = %v, want a refusal naming pid %s", err, pid)
	}
	_ = h.cmd.Process.Kill()
	<-h.exited
	if err := m.RemovePod(pod); err != nil {
		t.Fatal(err)
	}
	assertPodRemoved(t, podDir)
}

// TestV2OOMKillFromMemoryEvents fills a container cgroup beyond memory.max:
// the kernel kills the process and memory.events counts it, in the container
// and (hierarchically) in the pod.
func TestV2OOMKillFromMemoryEvents(t *testing.T) {
	m, parent := requireV2VM(t)
	pod := m.PodCgroup(parent+"/kubepods/burstable/podoom", "oom")
	if err := m.CreatePod(pod, nil); err != nil {
		t.Fatal(err)
	}
	ctr := m.ContainerCgroupsPath(pod, "oom")
	if err := m.create(ctr, &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 8 << 20, MemorySwapLimitInBytes: 8 << 20}, 0); err != nil {
		t.Fatal(err)
	}
	ctrDir := filepath.Join(defaultRoot, ctr)
	checkFiles(t, ctrDir, map[string]string{"memory.max": strconv.Itoa(8 << 20), "memory.swap.max": "0"})
	h := startHelper(t, "alloc")
	moveTo(t, m, ctr, h.cmd.Process.Pid)
	h.start(t)
	h.waitOOMKilled(t, "")
	for _, d := range []string{ctrDir, filepath.Join(defaultRoot, pod)} {
		if n := eventCount(t, filepath.Join(d, "memory.events"), "oom_kill"); n < 1 {
			t.Errorf("%s/memory.events oom_kill = %d, want ≥ 1", d, n)
		}
	}
	if oom, err := m.OOMKilled(ctr); err != nil || !oom {
		t.Errorf("OOMKilled = %v, %v", oom, err)
	}
	if st, err := m.Stats(ctr); err != nil || st.OOMKills < 1 {
		t.Errorf("Stats after the OOM kill = %+v, %v", st, err)
	}
	if err := m.RemovePod(pod); err != nil {
		t.Fatal(err)
	}
	assertPodRemoved(t, filepath.Join(defaultRoot, pod))
}

// assertPodRemoved checks that the pod's cgroup is gone with everything in
// it, and only it: its parent (the kubelet's QoS cgroup) stays, empty.
func assertPodRemoved(t *testing.T, podDir string) {
	t.Helper()
	if exists(podDir) {
		t.Errorf("pod cgroup %s left behind", podDir)
	}
	ents, err := os.ReadDir(filepath.Dir(podDir))
	if err != nil {
		t.Fatalf("the pod's parent cgroup: %v", err)
	}
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("cgroup left behind: %s", filepath.Join(filepath.Dir(podDir), e.Name()))
		}
	}
}

func checkFiles(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	for file, v := range want {
		p := filepath.Join(dir, file)
		if !exists(p) {
			t.Errorf("%s missing", p)
			continue
		}
		if got := readFile(t, p); got != v {
			t.Errorf("%s = %q, want %q", p, got, v)
		}
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// eventCount reads one counter of a flat-keyed file such as memory.events.
func eventCount(t *testing.T, p, key string) uint64 {
	t.Helper()
	for _, l := range strings.Split(readFile(t, p), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == key {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", p, l)
			}
			return n
		}
	}
	t.Fatalf("%s has no %s", p, key)
	return 0
}
