package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/opencontainers/cgroups"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestSharesToWeight(t *testing.T) {
	// runc's conversion (opencontainers/cgroups): the v1 default 1024 maps
	// to the v2 default 100, the ends of the ranges to each other.
	for shares, want := range map[uint64]uint64{0: 0, 1: 1, 2: 1, 1024: 100, 262144: 10000, 1 << 20: 10000} {
		if got := SharesToWeight(shares); got != want {
			t.Errorf("SharesToWeight(%d) = %d, want %d", shares, got, want)
		}
	}
	for s := uint64(3); s < 262144; s += 997 { // monotonic
		if SharesToWeight(s) > SharesToWeight(s+997) {
			t.Fatalf("not monotonic at %d", s)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func fullResources() *runtimeapi.LinuxContainerResources {
	return &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512,
		MemoryLimitInBytes: 256 << 20, MemorySwapLimitInBytes: 512 << 20,
		CpusetCpus: "0-1,3", CpusetMems: "0",
		HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: 0}, {PageSize: "1GB", Limit: 1 << 30}},
		OomScoreAdj:    500, // a process setting, not a cgroup one
	}
}

func TestSpecResources(t *testing.T) {
	all := hostCaps{swap: true, hugetlb: true}
	want := &specs.LinuxResources{
		CPU:            &specs.LinuxCPU{Shares: ptr(uint64(512)), Quota: ptr(int64(50000)), Period: ptr(uint64(100000)), Cpus: "0-1,3", Mems: "0"},
		Memory:         &specs.LinuxMemory{Limit: ptr(int64(256 << 20)), Swap: ptr(int64(512 << 20))},
		Pids:           &specs.LinuxPids{Limit: ptr(int64(100))},
		HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}, {Pagesize: "1GB", Limit: 1 << 30}},
	}
	for _, mode := range []Mode{V1, V2} {
		got, err := specResources(fullResources(), mode, 100, all)
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v:\n got %+v\nwant %+v", mode, got, want)
		}
	}

	// Without swap accounting or hugetlb those fields are dropped, the rest stays.
	got, err := specResources(fullResources(), V1, 0, hostCaps{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Memory.Swap != nil || got.HugepageLimits != nil || got.Pids != nil || *got.Memory.Limit != 256<<20 {
		t.Errorf("without caps: %+v %+v", got.Memory, got)
	}

	// Unified keys: verbatim on v2, refused on v1 naming the key.
	res := &runtimeapi.LinuxContainerResources{Unified: map[string]string{"memory.high": "200M", "cpu.idle": "1"}}
	got, err = specResources(res, V2, 0, all)
	if err != nil || !reflect.DeepEqual(got.Unified, res.Unified) {
		t.Errorf("v2 unified: %v %v", got, err)
	}
	if _, err := specResources(res, V1, 0, all); err == nil || !strings.Contains(err.Error(), `unified["cpu.idle"]`) {
		t.Errorf("v1 unified: %v", err)
	}

	// Unlimited quota and pids.
	got, err = specResources(&runtimeapi.LinuxContainerResources{CpuQuota: -1}, V2, -1, all)
	if err != nil || *got.CPU.Quota != -1 || *got.Pids.Limit != -1 || got.Memory != nil {
		t.Errorf("unlimited: %+v %v", got, err)
	}
	// nil resources: nothing but the pids limit.
	got, err = SpecResources(nil, DetectMode(), 0)
	if err != nil || !reflect.DeepEqual(got, &specs.LinuxResources{}) {
		t.Errorf("nil: %+v %v", got, err)
	}
}

func TestSpecResourcesErrors(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(r *runtimeapi.LinuxContainerResources)
		mode  Mode
		pids  int64
	}{
		{"cpu_shares", func(r *runtimeapi.LinuxContainerResources) { r.CpuShares = -2 }, V1, 0},
		{"cpu_period", func(r *runtimeapi.LinuxContainerResources) { r.CpuPeriod = 0 }, V1, 0}, // quota without period
		{"cpu_period", func(r *runtimeapi.LinuxContainerResources) { r.CpuPeriod = 2000000 }, V2, 0},
		{"cpu_period", func(r *runtimeapi.LinuxContainerResources) { r.CpuPeriod = -5 }, V2, 0},
		{"cpu_quota", func(r *runtimeapi.LinuxContainerResources) { r.CpuQuota = 500 }, V1, 0},
		{"cpu_quota", func(r *runtimeapi.LinuxContainerResources) { r.CpuQuota = -7 }, V1, 0},
		{"cpuset_cpus", func(r *runtimeapi.LinuxContainerResources) { r.CpusetCpus = "0-" }, V1, 0},
		{"cpuset_cpus", func(r *runtimeapi.LinuxContainerResources) { r.CpusetCpus = "3-1" }, V2, 0},
		{"cpuset_cpus", func(r *runtimeapi.LinuxContainerResources) { r.CpusetCpus = "all" }, V2, 0},
		{"cpuset_mems", func(r *runtimeapi.LinuxContainerResources) { r.CpusetMems = "0,,1" }, V2, 0},
		{"memory_limit_in_bytes", func(r *runtimeapi.LinuxContainerResources) { r.MemoryLimitInBytes = -1 }, V1, 0},
		{"memory_swap_limit_in_bytes", func(r *runtimeapi.LinuxContainerResources) { r.MemorySwapLimitInBytes = -1 }, V1, 0},
		{"memory_swap_limit_in_bytes", func(r *runtimeapi.LinuxContainerResources) { r.MemorySwapLimitInBytes = 1 << 20 }, V2, 0},
		{"memory_swap_limit_in_bytes", func(r *runtimeapi.LinuxContainerResources) { r.MemoryLimitInBytes = 0 }, V2, 0},
		{"hugepage_limits[1].page_size", func(r *runtimeapi.LinuxContainerResources) { r.HugepageLimits[1].PageSize = "huge" }, V1, 0},
		{`unified["memory"]`, func(r *runtimeapi.LinuxContainerResources) { r.Unified = map[string]string{"memory": "1"} }, V2, 0},
		{`unified["../x.y"]`, func(r *runtimeapi.LinuxContainerResources) { r.Unified = map[string]string{"../x.y": "1"} }, V2, 0},
		{"pids limit", func(r *runtimeapi.LinuxContainerResources) {}, V2, -2},
		{"mode", func(r *runtimeapi.LinuxContainerResources) {}, 0, 0},
	} {
		r := fullResources()
		tc.edit(r)
		_, err := specResources(r, tc.mode, tc.pids, hostCaps{swap: true, hugetlb: true})
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v", tc.field, err)
		}
	}
}

func TestLibResources(t *testing.T) {
	s, err := specResources(fullResources(), V2, 10, hostCaps{swap: true, hugetlb: true})
	if err != nil {
		t.Fatal(err)
	}
	r := libResources(s, V2)
	if r.CpuShares != 512 || r.CpuWeight != SharesToWeight(512) || r.CpuQuota != 50000 || r.CpuPeriod != 100000 ||
		r.Memory != 256<<20 || r.MemorySwap != 512<<20 || *r.PidsLimit != 10 || len(r.HugetlbLimit) != 2 || !r.SkipDevices {
		t.Errorf("v2: %+v", r)
	}
	if r := libResources(s, V1); r.CpuWeight != 0 || r.Unified != nil {
		t.Errorf("v1 got v2 fields: %+v", r)
	}
}

func TestPaths(t *testing.T) {
	fsm := &Manager{driver: Cgroupfs}
	sdm := &Manager{driver: Systemd}
	for _, tc := range []struct{ got, want string }{
		{fsm.PodCgroup("/kubepods/burstable/pod1234-ab", "1234-ab"), "/kubepods/burstable/pod1234-ab"},
		{fsm.PodCgroup("kubepods/pod1/", "1"), "/kubepods/pod1"},
		{fsm.PodCgroup("", "1234-ab"), "/berth/pod1234-ab"},
		{fsm.PodCgroup("", "../../etc"), "/berth/pod______etc"},
		{fsm.ContainerCgroupsPath("/kubepods/pod1", "c0ffee"), "/kubepods/pod1/c0ffee"},
		{fsm.ContainerCgroupsPath("/kubepods/pod1", "../x"), "/kubepods/pod1/___x"},
		{sdm.PodCgroup("kubepods-burstable-pod1234_ab.slice", "1234-ab"), "kubepods-burstable-pod1234_ab.slice"},
		{sdm.PodCgroup("", "1234-ab"), "berth-pod1234_ab.slice"},
		// The kubelet's expanded form (CgroupName.ToSystemd): its slice.
		{sdm.PodCgroup("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_ab.slice", "1234-ab"), "kubepods-burstable-pod1234_ab.slice"},
		{sdm.PodCgroup("/kubepods.slice/kubepods-pod1.slice", "1"), "kubepods-pod1.slice"},
		{sdm.PodCgroup("/test.slice", "1234-ab"), "test.slice"},
		// A path that is not its last element's expansion stays as given
		// (and is refused as a slice name when the pod's cgroup is made).
		{sdm.PodCgroup("/system.slice/kubepods-pod1.slice", "1"), "/system.slice/kubepods-pod1.slice"},
		{sdm.ContainerCgroupsPath("kubepods-pod1.slice", "c0ffee"), "kubepods-pod1.slice:berth:c0ffee"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestFSPath(t *testing.T) {
	fsm := &Manager{driver: Cgroupfs}
	sdm := &Manager{driver: Systemd}
	for _, tc := range []struct {
		m        *Manager
		in, want string
	}{
		{fsm, "/kubepods/pod1/c1", "/kubepods/pod1/c1"},
		{fsm, "kubepods/../../x", "/x"},
		{sdm, "kubepods.slice", "/kubepods.slice"},
		{sdm, "kubepods-burstable-pod1.slice", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"},
		{sdm, "kubepods-burstable-pod1.slice:berth:c1", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/berth-c1.scope"},
		{sdm, ":berth:c1", "/system.slice/berth-c1.scope"},
		{sdm, "a-b.slice:x:a-b-c.slice", "/a.slice/a-b.slice/a-b-c.slice"},
		{sdm, "-.slice", "/"},
	} {
		got, err := tc.m.fsPath(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("fsPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "kubepods", "a--b.slice", "/kubepods/pod1", "a.slice:b", "a.slice:b:", "a.slice:b:c/d", "nope:b:c"} {
		if got, err := sdm.fsPath(bad); err == nil {
			t.Errorf("fsPath(%q) = %q, want an error", bad, got)
		}
	}
	for in, want := range map[string]string{"a-b-c.slice": "a-b.slice", "a.slice": "-.slice"} {
		if got := parentSlice(in); got != want {
			t.Errorf("parentSlice(%q) = %q, want %q", in, got, want)
		}
	}
	// The root cgroup is never a pod.
	if _, err := fsm.podPath("/"); err == nil {
		t.Error(`podPath("/") accepted`)
	}
	if _, err := sdm.podPath("-.slice"); err == nil {
		t.Error(`podPath("-.slice") accepted`)
	}
	if _, err := sdm.podPath("kubepods.slice:berth:c1"); err == nil {
		t.Error("systemd pod path accepted a container path")
	}
}

func TestNew(t *testing.T) {
	if _, err := newManager("cgroupv3", t.TempDir(), V2); err == nil {
		t.Error("unknown driver accepted")
	}
	m, err := newManager("", t.TempDir(), V2)
	if err != nil || m.Driver() != Cgroupfs || m.Mode() != V2 {
		t.Errorf("default driver: %v %v", m, err)
	}
	if _, err := newManager(Cgroupfs, t.TempDir(), V1); err == nil {
		t.Error("v1 without hierarchies accepted")
	}
	if !exists("/run/systemd/system") {
		if _, err := New(Systemd); err == nil || !strings.Contains(err.Error(), "systemd is not running") {
			t.Errorf("New(systemd) without systemd: %v", err)
		}
	}
	want := V1
	if exists("/sys/fs/cgroup/cgroup.controllers") { // only the unified root has it
		want = V2
	}
	if got := DetectMode(); got != want {
		t.Errorf("DetectMode() = %v, want %v", got, want)
	}
}

// fakeCgroupfs makes the opencontainers/cgroups helpers accept files outside
// /sys/fs/cgroup and create the files they write, like the kernel would.
func fakeCgroupfs(t *testing.T) string {
	t.Helper()
	cgroups.TestMode = true
	t.Cleanup(func() { cgroups.TestMode = false })
	return t.TempDir()
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// fakeV1 is a hybrid v1 tree with cpu and cpuacct co-mounted behind symlinks.
func fakeV1(t *testing.T) string {
	root := fakeCgroupfs(t)
	for _, d := range []string{"cpu,cpuacct", "memory", "pids", "systemd", "unified"} {
		writeFiles(t, filepath.Join(root, d), nil)
	}
	writeFiles(t, filepath.Join(root, "memory"), map[string]string{"memory.memsw.limit_in_bytes": "9223372036854771712"})
	for _, l := range []string{"cpu", "cpuacct"} {
		if err := os.Symlink("cpu,cpuacct", filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func writeV1Cgroup(t *testing.T, root, rel, oomControl string) {
	writeFiles(t, filepath.Join(root, "memory", rel), map[string]string{
		"memory.stat": "cache 100\nrss 50\ninactive_file 10\npgfault 5\npgmajfault 1\n" +
			"total_cache 4096\ntotal_rss 3000000\ntotal_inactive_file 1000000\ntotal_pgfault 700\ntotal_pgmajfault 7\n",
		"memory.usage_in_bytes": "5000000\n", "memory.max_usage_in_bytes": "6000000\n", "memory.failcnt": "0\n",
		"memory.limit_in_bytes": "9223372036854771712\n", "memory.use_hierarchy": "1\n",
		"memory.oom_control": oomControl,
	})
	writeFiles(t, filepath.Join(root, "cpu,cpuacct", rel), map[string]string{
		"cpuacct.usage": "123456789\n", "cpuacct.stat": "user 10\nsystem 5\n", "cpuacct.usage_percpu": "100000000 23456789 \n",
		"cpu.stat": "nr_periods 4\nnr_throttled 1\nthrottled_time 99\n",
	})
	writeFiles(t, filepath.Join(root, "pids", rel), map[string]string{"pids.current": "3\n", "pids.max": "max\n"})
}

var wantStats = Stats{CPUUsageNanos: 123456789, MemoryUsageBytes: 5000000, MemoryWorkingSetBytes: 4000000,
	MemoryRSSBytes: 3000000, MemoryCacheBytes: 4096, PageFaults: 700, MajorPageFaults: 7, Pids: 3}

func checkStats(t *testing.T, m *Manager, path string, oomKills uint64) {
	t.Helper()
	got, err := m.Stats(path)
	if err != nil {
		t.Fatalf("Stats(%q): %v", path, err)
	}
	if got.Timestamp.IsZero() {
		t.Error("no timestamp")
	}
	got.Timestamp = wantStats.Timestamp
	want := wantStats
	want.OOMKills = oomKills
	if got != want {
		t.Errorf("Stats(%q)\n got %+v\nwant %+v", path, got, want)
	}
}

func TestV1Fake(t *testing.T) {
	root := fakeV1(t)
	h, err := v1Hierarchies(root)
	if err != nil {
		t.Fatal(err)
	}
	cc := filepath.Join(root, "cpu,cpuacct")
	wantH := map[string]string{"cpu": cc, "cpuacct": cc, "memory": filepath.Join(root, "memory"),
		"pids": filepath.Join(root, "pids"), "name=systemd": filepath.Join(root, "systemd"), "": filepath.Join(root, "unified")}
	if !reflect.DeepEqual(h, wantH) {
		t.Errorf("hierarchies:\n got %v\nwant %v", h, wantH)
	}
	if c := detectCaps(root, V1, h); !c.swap || c.hugetlb {
		t.Errorf("caps %+v, want swap only", c)
	}

	fsm, err := newManager(Cgroupfs, root, V1)
	if err != nil {
		t.Fatal(err)
	}
	if d := fsm.dirs("/p"); len(d) != 5 || d[0] != filepath.Join(cc, "p") {
		t.Errorf("dirs: %v (co-mounted controllers must come once)", d)
	}
	sdm, err := newManager(Systemd, root, V1)
	if err != nil {
		t.Fatal(err)
	}
	writeV1Cgroup(t, root, "/kubepods/pod1/c1", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
	writeV1Cgroup(t, root, "/kubepods.slice/kubepods-pod1.slice/berth-c1.scope", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
	writeV1Cgroup(t, root, "/old/c1", "oom_kill_disable 0\nunder_oom 0\n")

	checkStats(t, fsm, "/kubepods/pod1/c1", 2)
	checkStats(t, sdm, "kubepods-pod1.slice:berth:c1", 0)
	for _, tc := range []struct {
		m    *Manager
		path string
		want bool
	}{{fsm, "/kubepods/pod1/c1", true}, {sdm, "kubepods-pod1.slice:berth:c1", false}} {
		if got, err := tc.m.OOMKilled(tc.path); err != nil || got != tc.want {
			t.Errorf("OOMKilled(%q) = %v, %v; want %v", tc.path, got, err, tc.want)
		}
	}
	if _, err := fsm.OOMKilled("/old/c1"); err == nil || !strings.Contains(err.Error(), "no oom_kill") {
		t.Errorf("OOMKilled without a counter: %v", err)
	}
	if _, err := fsm.Stats("/kubepods/gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stats of a missing cgroup: %v", err)
	}
	if _, err := fsm.OOMKilled("/kubepods/gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OOMKilled of a missing cgroup: %v", err)
	}
}

// fakeV2 is a unified root offering the usual controllers, with one child
// (as systemd's init.scope) that shows swap accounting.
func fakeV2(t *testing.T) string {
	root := fakeCgroupfs(t)
	writeFiles(t, root, map[string]string{"cgroup.controllers": "cpuset cpu io memory hugetlb pids\n", "cgroup.subtree_control": ""})
	writeFiles(t, filepath.Join(root, "init.scope"), map[string]string{"memory.max": "max\n", "memory.swap.max": "max\n"})
	return root
}

func TestV2FakeCreate(t *testing.T) {
	root := fakeV2(t)
	m, err := newManager(Cgroupfs, root, V2)
	if err != nil {
		t.Fatal(err)
	}
	if m.caps != (hostCaps{swap: true, hugetlb: true}) {
		t.Errorf("caps %+v", m.caps)
	}
	pod := m.PodCgroup("/kubepods/burstable/pod1", "1")
	if err := m.CreatePod(pod, nil); err != nil {
		t.Fatal(err)
	}
	// Every ancestor hands all controllers down; the pod's own
	// subtree_control is runc's to set when it adds a container.
	for _, d := range []string{"", "kubepods", "kubepods/burstable"} {
		if got := readFile(t, filepath.Join(root, d, "cgroup.subtree_control")); got != "+cpuset +cpu +io +memory +hugetlb +pids" {
			t.Errorf("%s/cgroup.subtree_control = %q", d, got)
		}
	}
	podDir := filepath.Join(root, "kubepods/burstable/pod1")
	if !exists(podDir) || exists(filepath.Join(podDir, "cgroup.subtree_control")) {
		t.Errorf("pod dir %s: want it, without subtree_control", podDir)
	}

	// The kernel fills cgroup.controllers of a new cgroup; so does the test.
	writeFiles(t, podDir, map[string]string{"cgroup.controllers": "cpuset cpu io memory hugetlb pids\n"})
	res := fullResources()
	res.Unified = map[string]string{"memory.high": "200M"}
	// The pod cgroup exists now, so CreatePod would keep its limits: map
	// the resources onto it as for a new one.
	if err := m.create(pod, res, 0); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"cpu.weight":       "59", // SharesToWeight(512)
		"cpu.max":          "50000 100000",
		"memory.max":       "268435456",
		"memory.swap.max":  "268435456", // v2 swap excludes memory: 512Mi-256Mi
		"cpuset.cpus":      "0-1,3",
		"cpuset.mems":      "0",
		"hugetlb.2MB.max":  "0",
		"hugetlb.1GB.max":  "1073741824",
		"memory.high":      "200M",
		"cgroup.procs":     "",
		"pids.max":         "",
		"cpu.shares":       "",
		"memory.swap.high": "",
	} {
		p := filepath.Join(podDir, file)
		if want == "" {
			if exists(p) {
				t.Errorf("%s written", file)
			}
			continue
		}
		if got := readFile(t, p); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if SharesToWeight(512) != 59 {
		t.Errorf("SharesToWeight(512) = %d", SharesToWeight(512))
	}

	// CreatePod of an existing pod cgroup (the kubelet's) keeps its limits.
	if err := m.CreatePod(pod, &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, CpuQuota: 10000, CpuPeriod: 100000}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"memory.max": "268435456", "cpu.max": "50000 100000"} {
		if got := readFile(t, filepath.Join(podDir, file)); got != want {
			t.Errorf("%s = %q after CreatePod of the existing pod cgroup, want it kept at %q", file, got, want)
		}
	}

	// A container cgroup made the way runc would, with the pids limit.
	ctr := m.ContainerCgroupsPath(pod, "c1")
	writeFiles(t, filepath.Join(root, ctr), map[string]string{"cgroup.controllers": "cpuset cpu io memory hugetlb pids\n"})
	if err := m.create(ctr, &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 8 << 20}, 50); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, ctr, "pids.max")); got != "50" {
		t.Errorf("pids.max = %q", got)
	}
	if got := readFile(t, filepath.Join(podDir, "cgroup.subtree_control")); !strings.Contains(got, "+memory") {
		t.Errorf("pod subtree_control after a container = %q", got)
	}

	// A process left in a container cgroup stops RemovePod, which names it.
	writeFiles(t, filepath.Join(root, ctr), map[string]string{"cgroup.procs": "4242\n"})
	err = m.RemovePod(pod)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(root, ctr)) || !strings.Contains(err.Error(), "4242") {
		t.Errorf("RemovePod with a process: %v", err)
	}
	if !exists(filepath.Join(root, ctr)) {
		t.Error("RemovePod removed something although it refused")
	}
	if err := m.RemovePod("/kubepods/never"); err != nil {
		t.Errorf("RemovePod of a missing pod: %v", err)
	}
	if err := m.CreatePod("/", nil); err == nil {
		t.Error("CreatePod of the root cgroup accepted")
	}
}

func TestV2FakeStats(t *testing.T) {
	root := fakeV2(t)
	fsm, err := newManager(Cgroupfs, root, V2)
	if err != nil {
		t.Fatal(err)
	}
	sdm, err := newManager(Systemd, root, V2)
	if err != nil {
		t.Fatal(err)
	}
	files := func(events string) map[string]string {
		return map[string]string{
			"memory.stat":    "anon 3000000\nfile 4096\ninactive_file 1000000\nactive_file 0\npgfault 700\npgmajfault 7\n",
			"memory.current": "5000000\n", "memory.max": "max\n", "memory.events": events,
			"cpu.stat":     "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
			"pids.current": "3\n", "pids.max": "max\n",
		}
	}
	writeFiles(t, filepath.Join(root, "kubepods/pod1/c1"), files("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"))
	writeFiles(t, filepath.Join(root, "kubepods.slice/kubepods-pod1.slice/berth-c1.scope"), files("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"))

	want := wantStats
	wantStats.CPUUsageNanos = 123456000 // v2 counts µs
	defer func() { wantStats = want }()
	checkStats(t, fsm, "/kubepods/pod1/c1", 1)
	checkStats(t, sdm, "kubepods-pod1.slice:berth:c1", 0)
	if got, err := fsm.OOMKilled("/kubepods/pod1/c1"); err != nil || !got {
		t.Errorf("OOMKilled = %v, %v", got, err)
	}
	if got, err := sdm.OOMKilled("kubepods-pod1.slice:berth:c1"); err != nil || got {
		t.Errorf("OOMKilled = %v, %v", got, err)
	}
	if _, err := sdm.Stats("kubepods-gone.slice:berth:c1"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stats of a missing cgroup: %v", err)
	}
}

// TestParseKeyValues: only the keys asked for are kept, every line must be
// "key number", and a file longer than fileReader's buffer is read whole.
func TestParseKeyValues(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("filler 1\n", 2000) + "wanted 42\n" // 18 KB
	writeFiles(t, dir, map[string]string{"long.stat": long, "bad.stat": "wanted 1\nnot a key value file\n"})
	var r fileReader
	var v [2]uint64
	found, err := r.keyValues(dir, "long.stat", []string{"other", "wanted"}, v[:])
	if err != nil || found != 0b10 || v[1] != 42 {
		t.Errorf("keyValues(long.stat) = %b, %v, %v; want key 1 found, 42", found, v, err)
	}
	if _, err := r.keyValues(dir, "bad.stat", []string{"wanted"}, v[:]); err == nil || !strings.Contains(err.Error(), "not a key value file") {
		t.Errorf("keyValues(bad.stat) = %v, want an error naming the line", err)
	}
	if found, err := r.keyValues(dir, "missing.stat", []string{"wanted"}, v[:]); found != 0 || err != nil {
		t.Errorf("keyValues(missing.stat) = %b, %v; want nothing found, no error", found, err)
	}
}
