package cri

import (
	"testing"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/sandbox/stats"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A pod listed without usage still has a Linux message: the kubelet's CRI
// stats provider ranges over Linux.Containers of every listed pod without a
// nil check, and a nil Linux crashed it (seen in the cluster tier while a
// pod's network namespace was being made).
func TestPodStatsWithoutUsageHasLinux(t *testing.T) {
	p := &store.Pod{ID: "p1", Config: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "e2e", Uid: "u1"}}}
	st := podStatsWithoutUsage(p)
	if st.GetLinux() == nil {
		t.Fatal("Linux is nil: the kubelet dereferences it")
	}
	if len(st.Linux.Containers) != 0 || st.Linux.Cpu != nil || st.Linux.Memory != nil {
		t.Errorf("usage filled in: %v", st.Linux)
	}
	if a := st.GetAttributes(); a.GetId() != "p1" || a.GetMetadata().GetName() != "web" {
		t.Errorf("attributes %v, want the pod's", a)
	}
}

// PSI is nil where the kernel keeps none, and its full line only where the
// kernel writes one: the kubelet tells "no PSI" from "no pressure" by nil.
func TestPSIMessages(t *testing.T) {
	var u stats.Usage
	if (&cpuMsgs{}).fill(u).Psi != nil || (&memoryMsgs{}).fill(u).Psi != nil || (&ioMsgs{}).fill(u) != nil {
		t.Error("PSI filled in from a cgroup without pressure files")
	}
	u.PSI.CPU = cgroups.Pressure{Some: cgroups.PressureData{TotalNanos: 5000, Avg10: 1.5}, OK: true}
	u.PSI.IO = cgroups.Pressure{Some: cgroups.PressureData{TotalNanos: 7000}, Full: cgroups.PressureData{TotalNanos: 3000, Avg60: 0.25, Avg300: 0.5}, OK: true, HasFull: true}
	cpu := (&cpuMsgs{}).fill(u).GetPsi()
	if cpu.GetSome().GetTotal() != 5000 || cpu.GetSome().GetAvg10() != 1.5 || cpu.GetFull() != nil {
		t.Errorf("CPU PSI %v, want some total 5000 avg10 1.5 and no full", cpu)
	}
	io := (&ioMsgs{}).fill(u)
	if io.GetTimestamp() != u.Timestamp.UnixNano() || io.GetPsi().GetSome().GetTotal() != 7000 ||
		io.GetPsi().GetFull().GetTotal() != 3000 || io.GetPsi().GetFull().GetAvg60() != 0.25 || io.GetPsi().GetFull().GetAvg300() != 0.5 {
		t.Errorf("I/O %v, want some total 7000, full total 3000 avg60 0.25 avg300 0.5", io)
	}
}
