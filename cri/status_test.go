package cri

import (
	"testing"

	"github.com/berth-runtime/berth/sandbox/store"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerStatusCarriesResourcesAndMessage: the resources in force
// and the message reach the CRI status; a status without resources (a
// record from before berth kept them) has none rather than zero limits.
func TestContainerStatusCarriesResourcesAndMessage(t *testing.T) {
	ctr := &store.Container{ID: "c1", PodID: "p1", Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c"}}}
	period, quota, limit := uint64(100000), int64(50000), int64(96<<20)
	limited := *ctr
	limited.Resources = &specs.LinuxResources{CPU: &specs.LinuxCPU{Period: &period, Quota: &quota}, Memory: &specs.LinuxMemory{Limit: &limit}}
	res := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, MemoryLimitInBytes: 96 << 20}
	st := containerStatus(&store.ContainerStatus{Container: &limited, State: runtimeapi.ContainerState_CONTAINER_EXITED,
		Reason: "OOMKilled", Message: "killed"})
	if !proto.Equal(st.GetResources().GetLinux(), res) || st.Message != "killed" {
		t.Errorf("status resources %v, message %q; want %v and the message", st.GetResources(), st.Message, res)
	}
	if st := containerStatus(&store.ContainerStatus{Container: ctr}); st.Resources != nil {
		t.Errorf("status without resources: %v, want none", st.Resources)
	}
}
