package integration

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestContainerAndPodStats(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("stats")
	pod := e.runPod(t, cfg)
	// Busy for a moment, then idle: the CPU counter moves, the process stays.
	ctr := e.createContainer(t, pod, cfg, "busy", "/bin/sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec /bin/sleep 1000")
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	ex, err := e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: ctr, Timeout: 10,
		Cmd: []string{"/bin/busybox", "dd", "if=/dev/zero", "of=/tmp/filler", "bs=1024", "count=1024"}})
	if err != nil || ex.ExitCode != 0 {
		t.Fatalf("write 1 MiB in the container: %v %s", err, ex.GetStderr())
	}

	// The writable layer is walked in the background: its figures come
	// after the first call.
	var st *runtimeapi.ContainerStats
	eventually(5*time.Second, func() bool {
		list, err := e.d.Runtime.ListContainerStats(t.Context(), &runtimeapi.ListContainerStatsRequest{
			Filter: &runtimeapi.ContainerStatsFilter{PodSandboxId: pod}})
		if err != nil || len(list.Stats) != 1 {
			t.Fatalf("ListContainerStats = %v, %v", list.GetStats(), err)
		}
		st = list.Stats[0]
		return st.WritableLayer.UsedBytes.GetValue() >= 1<<20
	})
	if st.Attributes.Id != ctr || st.Attributes.Labels["container"] != "busy" {
		t.Errorf("attributes = %+v", st.Attributes)
	}
	if st.Cpu.UsageCoreNanoSeconds.GetValue() == 0 || st.Memory.WorkingSetBytes.GetValue() == 0 {
		t.Errorf("cpu %v, memory working set %v: want both > 0", st.Cpu, st.Memory)
	}
	if st.WritableLayer.UsedBytes.GetValue() < 1<<20 || st.WritableLayer.InodesUsed.GetValue() == 0 {
		t.Errorf("writable layer %v: want at least the 1 MiB written", st.WritableLayer)
	}

	// Short IDs select, in the lists, their Stream* twins and the
	// one-container call, each entry with its figures.
	short := &runtimeapi.ContainerStatsFilter{Id: ctr[:6], PodSandboxId: pod[:6]}
	list, err := e.d.Runtime.ListContainerStats(t.Context(), &runtimeapi.ListContainerStatsRequest{Filter: short})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := e.d.Runtime.StreamContainerStats(t.Context(), &runtimeapi.StreamContainerStatsRequest{Filter: short})
	var streamed []*runtimeapi.ContainerStats
	streamAll(t, stream, err, func(r *runtimeapi.StreamContainerStatsResponse) []string {
		streamed = append(streamed, r.ContainerStats...)
		return nil
	})
	one, err := e.d.Runtime.ContainerStats(t.Context(), &runtimeapi.ContainerStatsRequest{ContainerId: ctr[:6]})
	if err != nil {
		t.Fatal(err)
	}
	for call, got := range map[string][]*runtimeapi.ContainerStats{"ListContainerStats": list.Stats, "StreamContainerStats": streamed,
		"ContainerStats": {one.Stats}} {
		if len(got) != 1 || got[0].Attributes.GetId() != ctr || got[0].Attributes.Labels["container"] != "busy" ||
			got[0].Cpu.GetUsageCoreNanoSeconds().GetValue() == 0 || got[0].Memory.GetWorkingSetBytes().GetValue() == 0 ||
			got[0].WritableLayer.GetUsedBytes().GetValue() < 1<<20 {
			t.Errorf("%s by short IDs = %v, want %s with its figures", call, got, ctr)
		}
	}

	time.Sleep(100 * time.Millisecond)
	ps, err := e.d.Runtime.PodSandboxStats(t.Context(), &runtimeapi.PodSandboxStatsRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatal(err)
	}
	l := ps.Stats.Linux
	if ps.Stats.Attributes.Id != pod || l.Memory.WorkingSetBytes.GetValue() == 0 || l.Process.ProcessCount.GetValue() == 0 ||
		len(l.Containers) != 1 || l.Containers[0].Attributes.Id != ctr {
		t.Errorf("PodSandboxStats = %+v", ps.Stats)
	}
	all, err := e.d.Runtime.ListPodSandboxStats(t.Context(), &runtimeapi.ListPodSandboxStatsRequest{
		Filter: &runtimeapi.PodSandboxStatsFilter{LabelSelector: map[string]string{"app": "stats"}}})
	if err != nil || len(all.Stats) != 1 {
		t.Errorf("ListPodSandboxStats by label = %v, %v", all.GetStats(), err)
	}
	podStream, err := e.d.Runtime.StreamPodSandboxStats(t.Context(), &runtimeapi.StreamPodSandboxStatsRequest{
		Filter: &runtimeapi.PodSandboxStatsFilter{Id: pod[:6]}})
	var podsStreamed []*runtimeapi.PodSandboxStats
	streamAll(t, podStream, err, func(r *runtimeapi.StreamPodSandboxStatsResponse) []string {
		podsStreamed = append(podsStreamed, r.PodSandboxStats...)
		return nil
	})
	if len(podsStreamed) != 1 || podsStreamed[0].Attributes.GetId() != pod || len(podsStreamed[0].GetLinux().GetContainers()) != 1 ||
		podsStreamed[0].Linux.Containers[0].Attributes.GetId() != ctr || podsStreamed[0].Linux.Containers[0].Memory.GetWorkingSetBytes().GetValue() == 0 {
		t.Errorf("StreamPodSandboxStats by short ID = %v, want %s with %s and its figures", podsStreamed, pod, ctr)
	}
	nodeWideListKept(t, e, pod, cfg, ctr)
	e.removePod(t, pod)
}

// nodeWideListKept: the lists without a filter, which berthd keeps between
// changes, show each new sample, a container created, started and removed.
func nodeWideListKept(t *testing.T, e *podEnv, pod string, cfg *runtimeapi.PodSandboxConfig, ctr string) {
	states := func() map[string]runtimeapi.ContainerState {
		list, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]runtimeapi.ContainerState{}
		for _, c := range list.Containers {
			byID[c.Id] = c.State
		}
		return byID
	}
	all := func() map[string]*runtimeapi.ContainerStats {
		list, err := e.d.Runtime.ListContainerStats(t.Context(), &runtimeapi.ListContainerStatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]*runtimeapi.ContainerStats{}
		for _, s := range list.Stats {
			byID[s.Attributes.GetId()] = s
		}
		return byID
	}
	first := all()[ctr]
	if first.GetCpu().GetTimestamp() == 0 {
		t.Fatalf("node-wide list: %s has %v, want its figures", ctr, first)
	}
	if !eventually(5*time.Second, func() bool { return all()[ctr].GetCpu().GetTimestamp() > first.Cpu.Timestamp }) {
		t.Errorf("node-wide list: %s's sample of %d is still answered after 5s", ctr, first.Cpu.Timestamp)
	}
	two := e.createContainer(t, pod, cfg, "two", "/bin/sleep", "1000")
	if s, ok := states()[two]; !ok || s != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Errorf("ListContainers: the container created, %s, is %v (listed: %v)", two, s, ok)
	}
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: two}); err != nil {
		t.Fatal(err)
	}
	if all()[two] == nil {
		t.Errorf("node-wide list: the container started, %s, is missing", two)
	}
	if s := states()[two]; s != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("ListContainers: the container started, %s, is %v", two, s)
	}
	if _, err := e.d.Runtime.StopContainer(t.Context(), &runtimeapi.StopContainerRequest{ContainerId: two}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: two}); err != nil {
		t.Fatal(err)
	}
	if all()[two] != nil {
		t.Errorf("node-wide list: the container removed, %s, is still listed", two)
	}
	if _, ok := states()[two]; ok {
		t.Errorf("ListContainers: the container removed, %s, is still listed", two)
	}
}

// TestStatsOneContainerUnreadable: a container whose cgroup cannot be read
// is listed without usage; the node-wide lists still answer, with every
// other container's figures.
func TestStatsOneContainerUnreadable(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("stats-fault")
	pod := e.runPod(t, cfg)
	bad := e.runContainer(t, pod, cfg, e.ctrConfig("bad", sleeper...))
	good := e.runContainer(t, pod, cfg, e.ctrConfig("good", sleeper...))

	// Garbage over the bad container's memory.stat makes its stats fail.
	stat := memoryStatOf(t, bad)
	garbage := filepath.Join(t.TempDir(), "memory.stat")
	if err := os.WriteFile(garbage, []byte("not a key value file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(garbage, stat, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(stat, unix.MNT_DETACH) })
	if _, err := e.d.Runtime.ContainerStats(t.Context(), &runtimeapi.ContainerStatsRequest{ContainerId: bad}); err == nil {
		t.Fatal("ContainerStats of the container with a garbled memory.stat succeeded: the fault is not injected")
	}

	byID := func(stats []*runtimeapi.ContainerStats) map[string]*runtimeapi.ContainerStats {
		m := map[string]*runtimeapi.ContainerStats{}
		for _, s := range stats {
			m[s.Attributes.GetId()] = s
		}
		return m
	}
	check := func(call string, got map[string]*runtimeapi.ContainerStats) {
		if b := got[bad]; b == nil || b.Memory != nil || b.Cpu != nil {
			t.Errorf("%s: the unreadable container is %v, want listed without usage", call, b)
		}
		if g := got[good]; g == nil || g.Memory.GetWorkingSetBytes().GetValue() == 0 {
			t.Errorf("%s: the readable container is %v, want its usage", call, g)
		}
	}
	list, err := e.d.Runtime.ListContainerStats(t.Context(), &runtimeapi.ListContainerStatsRequest{})
	if err != nil {
		t.Fatalf("ListContainerStats: %v", err)
	}
	check("ListContainerStats", byID(list.Stats))
	pods, err := e.d.Runtime.ListPodSandboxStats(t.Context(), &runtimeapi.ListPodSandboxStatsRequest{})
	if err != nil || len(pods.Stats) != 1 {
		t.Fatalf("ListPodSandboxStats = %v, %v", pods.GetStats(), err)
	}
	check("ListPodSandboxStats", byID(pods.Stats[0].GetLinux().GetContainers()))

	if err := unix.Unmount(stat, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// memoryStatOf finds the memory.stat of a container's cgroup (v1 memory
// hierarchy or v2), by its ID in the cgroup path of its process.
func memoryStatOf(t *testing.T, ctr string) string {
	t.Helper()
	var found string
	for _, root := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && found == "" && d.IsDir() && strings.Contains(d.Name(), ctr) {
				if _, err := os.Stat(filepath.Join(p, "memory.stat")); err == nil {
					found = filepath.Join(p, "memory.stat")
				}
			}
			return nil
		})
		if found != "" {
			return found
		}
	}
	t.Fatalf("no memory cgroup of container %s", ctr)
	return ""
}
