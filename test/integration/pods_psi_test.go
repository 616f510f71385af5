package integration

import (
	"os"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cgroups"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerAndPodPSI loads two containers, one spinning under a tenth of
// a CPU (its runnable time beyond the quota is CPU pressure) and one writing
// files three times its memory limit (page cache reclaimed under the limit
// is memory pressure), and reads the pressure from ContainerStats,
// ListContainerStats, PodSandboxStats and ListPodSandboxStats. Where the
// kernel keeps no PSI for berth's cgroups (cgroup v1, as on the host tier's
// hybrid machine, or PSI off) the messages must be nil, not zeros that read
// as "no pressure"; the VM tier (cgroup v2, PSI on) sees the figures.
func TestContainerAndPodPSI(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("psi")
	pod := e.runPod(t, cfg)
	spin := e.ctrConfig("spin", "/bin/sh", "-c", "while :; do :; done")
	spin.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuQuota: 10000, CpuPeriod: 100000}}
	reclaim := e.ctrConfig("reclaim", "/bin/sh", "-c",
		"while :; do /bin/busybox dd if=/dev/zero of=/tmp/f bs=1048576 count=48 2>/dev/null; rm -f /tmp/f; done")
	reclaim.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}}
	spinID, reclaimID := e.runContainer(t, pod, cfg, spin), e.runContainer(t, pod, cfg, reclaim)

	if !kernelKeepsPSI() {
		t.Logf("cgroup mode %v, /proc/pressure/cpu readable: %v: no PSI for berth's cgroups here, so none may be reported",
			cgroups.DetectMode(), procPressureReadable())
		assertNoPSI(t, e, pod, spinID, reclaimID)
		e.removePod(t, pod)
		return
	}
	var cpu, mem *runtimeapi.ContainerStats
	var podSt *runtimeapi.PodSandboxStats
	ok := eventually(60*time.Second, func() bool {
		cpu, mem, podSt = containerStats(t, e, spinID), containerStats(t, e, reclaimID), podSandboxStats(t, e, pod)
		return cpu.GetCpu().GetPsi().GetSome().GetTotal() > 0 && mem.GetMemory().GetPsi().GetSome().GetTotal() > 0 &&
			podSt.GetLinux().GetCpu().GetPsi().GetSome().GetTotal() > 0 && podSt.GetLinux().GetMemory().GetPsi().GetSome().GetTotal() > 0
	})
	if !ok {
		t.Fatalf("within 60 s: spinning container's CPU PSI %v, reclaiming container's memory PSI %v, pod's CPU %v and memory %v: want some total > 0 in each",
			cpu.GetCpu().GetPsi(), mem.GetMemory().GetPsi(), podSt.GetLinux().GetCpu().GetPsi(), podSt.GetLinux().GetMemory().GetPsi())
	}
	t.Logf("CPU PSI of the spinning container %v; memory PSI of the reclaiming one %v, its I/O %v",
		cpu.GetCpu().GetPsi(), mem.GetMemory().GetPsi(), mem.GetIo())
	for what, psi := range map[string]*runtimeapi.PsiStats{
		"container memory": mem.GetMemory().GetPsi(), "container I/O": mem.GetIo().GetPsi(),
		"pod memory": podSt.GetLinux().GetMemory().GetPsi(), "pod I/O": podSt.GetLinux().GetIo().GetPsi(),
	} {
		if psi.GetFull() == nil || psi.GetSome() == nil {
			t.Errorf("%s PSI %v: want some and full", what, psi)
		}
	}
	if mem.GetIo().GetTimestamp() == 0 || podSt.GetLinux().GetIo().GetTimestamp() == 0 {
		t.Errorf("I/O usage without a timestamp: container %v, pod %v", mem.GetIo(), podSt.GetLinux().GetIo())
	}
	// The lists carry the same messages as the one-object calls.
	list, err := e.d.Runtime.ListContainerStats(t.Context(), &runtimeapi.ListContainerStatsRequest{
		Filter: &runtimeapi.ContainerStatsFilter{Id: spinID}})
	if err != nil || len(list.GetStats()) != 1 || list.Stats[0].GetCpu().GetPsi().GetSome().GetTotal() == 0 {
		t.Errorf("ListContainerStats = %v, %v: want the spinning container's CPU PSI", list.GetStats(), err)
	}
	pods, err := e.d.Runtime.ListPodSandboxStats(t.Context(), &runtimeapi.ListPodSandboxStatsRequest{
		Filter: &runtimeapi.PodSandboxStatsFilter{Id: pod}})
	if err != nil || len(pods.GetStats()) != 1 || pods.Stats[0].GetLinux().GetCpu().GetPsi().GetSome().GetTotal() == 0 {
		t.Errorf("ListPodSandboxStats = %v, %v: want the pod's CPU PSI", pods.GetStats(), err)
	}
	e.removePod(t, pod)
}

// kernelKeepsPSI says whether berth's cgroups have pressure files: cgroup
// v2 with PSI built in and on (Debian's kernels have it on; some others
// need psi=1 on the command line).
func kernelKeepsPSI() bool {
	return cgroups.DetectMode() == cgroups.V2 && procPressureReadable()
}

// procPressureReadable: with PSI off, /proc/pressure/cpu is there but its
// read fails.
func procPressureReadable() bool {
	_, err := os.ReadFile("/proc/pressure/cpu")
	return err == nil
}

func assertNoPSI(t *testing.T, e *podEnv, pod string, ctrs ...string) {
	t.Helper()
	for _, id := range ctrs {
		st := containerStats(t, e, id)
		if st.GetCpu() == nil || st.GetCpu().Psi != nil || st.GetMemory().Psi != nil || st.Io != nil {
			t.Errorf("container %s stats %v: want CPU and memory usage without PSI, and no I/O", id, st)
		}
	}
	l := podSandboxStats(t, e, pod).GetLinux()
	if l.GetCpu() == nil || l.GetCpu().Psi != nil || l.GetMemory().Psi != nil || l.Io != nil {
		t.Errorf("pod stats %v: want CPU and memory usage without PSI, and no I/O", l)
	}
}

func containerStats(t *testing.T, e *podEnv, id string) *runtimeapi.ContainerStats {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStats(t.Context(), &runtimeapi.ContainerStatsRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStats %s: %v", id, err)
	}
	return resp.Stats
}

func podSandboxStats(t *testing.T, e *podEnv, pod string) *runtimeapi.PodSandboxStats {
	t.Helper()
	resp, err := e.d.Runtime.PodSandboxStats(t.Context(), &runtimeapi.PodSandboxStatsRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatalf("PodSandboxStats %s: %v", pod, err)
	}
	return resp.Stats
}
