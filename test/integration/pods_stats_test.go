package integration

import (
	"testing"
	"time"

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

	list, err := e.d.Runtime.ListContainerStats(t.Context(), &runtimeapi.ListContainerStatsRequest{
		Filter: &runtimeapi.ContainerStatsFilter{PodSandboxId: pod}})
	if err != nil || len(list.Stats) != 1 {
		t.Fatalf("ListContainerStats = %v, %v", list.GetStats(), err)
	}
	st := list.Stats[0]
	if st.Attributes.Id != ctr || st.Attributes.Labels["container"] != "busy" {
		t.Errorf("attributes = %+v", st.Attributes)
	}
	if st.Cpu.UsageCoreNanoSeconds.GetValue() == 0 || st.Memory.WorkingSetBytes.GetValue() == 0 {
		t.Errorf("cpu %v, memory working set %v: want both > 0", st.Cpu, st.Memory)
	}
	if st.WritableLayer.UsedBytes.GetValue() < 1<<20 || st.WritableLayer.InodesUsed.GetValue() == 0 {
		t.Errorf("writable layer %v: want at least the 1 MiB written", st.WritableLayer)
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
	e.removePod(t, pod)
}
