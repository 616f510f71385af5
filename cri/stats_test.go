package cri

import (
	"testing"

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
