package integration

import (
	"maps"
	"slices"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestStatusFields: ContainerStatus shows the resources in force, as set at
// create and after an update; PodSandboxStatus carries the statuses of the
// pod's containers and the time they were taken; an OOM-killed container
// says why in its message.
func TestStatusFields(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("statusfields")
	pod := e.runPod(t, cfg)

	atCreate := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 20000, MemoryLimitInBytes: 64 << 20}
	cc := e.ctrConfig("limited", sleeper...)
	cc.Linux = &runtimeapi.LinuxContainerConfig{Resources: atCreate}
	ctr := e.create(t, pod, cfg, cc)
	assertResources(t, "after create", e.status(t, ctr), atCreate)
	e.start(t, ctr)
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	updated := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, MemoryLimitInBytes: 96 << 20}
	if _, err := e.d.Runtime.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctr, Linux: updated}); err != nil {
		t.Fatal(err)
	}
	assertResources(t, "after update", e.status(t, ctr), updated)

	hog := e.ctrConfig("hog", "/bin/sh", "-c", "x=$(/bin/busybox head -c 67108864 /dev/zero | /bin/busybox tr '\\0' a)")
	hog.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}}
	hogID := e.create(t, pod, cfg, hog)
	e.start(t, hogID)
	if st := e.waitState(t, hogID, runtimeapi.ContainerState_CONTAINER_EXITED); st.Reason != "OOMKilled" || st.Message == "" {
		t.Errorf("hog: reason %q, message %q; want OOMKilled and a message saying why", st.Reason, st.Message)
	}
	if st := e.status(t, ctr); st.Message != "" {
		t.Errorf("running container: message %q, want none", st.Message)
	}

	before := time.Now()
	resp, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatal(err)
	}
	if ts := time.Unix(0, resp.Timestamp); ts.Before(before.Add(-time.Second)) || ts.After(time.Now()) {
		t.Errorf("pod status timestamp %v, want the time of the call (%v)", ts, before)
	}
	got := map[string]*runtimeapi.ContainerStatus{}
	for _, st := range resp.ContainersStatuses {
		got[st.Id] = st
	}
	if len(got) != 2 || got[ctr] == nil || got[hogID] == nil {
		t.Fatalf("pod status lists containers %v, want %s and %s", slices.Collect(maps.Keys(got)), ctr, hogID)
	}
	if got[ctr].State != runtimeapi.ContainerState_CONTAINER_RUNNING || got[hogID].Reason != "OOMKilled" {
		t.Errorf("pod status: %s is %s, %s ended %q", ctr, got[ctr].State, hogID, got[hogID].Reason)
	}
	assertResources(t, "in the pod's status", got[ctr], updated)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

func assertResources(t *testing.T, when string, st *runtimeapi.ContainerStatus, want *runtimeapi.LinuxContainerResources) {
	t.Helper()
	if got := st.GetResources().GetLinux(); !proto.Equal(got, want) {
		t.Errorf("resources %s: %v, want %v", when, got, want)
	}
}
