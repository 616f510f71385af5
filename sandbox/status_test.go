package sandbox

import (
	"testing"
	"time"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerStateOrder: a container's state never goes back, whatever order
// the shim's events and berthd's own replies come in, and each change is
// one event, in order, with the pod's containers as they were then.
func TestContainerStateOrder(t *testing.T) {
	m := testManager(t)
	m.addTestPod(t, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil)
	m.addTestContainer(t, "ctr1", "pod1")
	sub := m.Subscribe()
	defer sub.Close()

	exited := shim.State{ID: "ctr1", Status: shim.StatusStopped, ExitCode: 3, FinishedAt: time.Now()}
	for _, st := range []shim.State{
		{ID: "ctr1", Status: shim.StatusCreated},
		{ID: "ctr1", Status: shim.StatusRunning, Pid: 42},
		exited,
		{ID: "ctr1", Status: shim.StatusRunning, Pid: 42}, // Start's reply, late
		{ID: "ctr1", Status: shim.StatusCreated},
	} {
		m.setContainerState("pod1", st)
	}
	c, err := m.ContainerStatus(t.Context(), "ctr")
	if err != nil {
		t.Fatal(err)
	}
	if c.State != runtimeapi.ContainerState_CONTAINER_EXITED || c.ExitCode != 3 || c.Reason != "Error" {
		t.Errorf("status %v exit %d %q, want EXITED 3 Error", c.State, c.ExitCode, c.Reason)
	}
	for _, want := range []runtimeapi.ContainerEventType{store.EventContainerStarted, store.EventContainerStopped} {
		select {
		case ev := <-sub.C:
			if ev.Type != want || ev.ContainerID != "ctr1" || ev.Pod.ID != "pod1" || len(ev.Containers) != 1 {
				t.Fatalf("event %v %s pod %s, %d containers; want %v ctr1 pod1, 1", ev.Type, ev.ContainerID, ev.Pod.ID, len(ev.Containers), want)
			}
		default:
			t.Fatalf("no %v event", want)
		}
	}
	select {
	case ev := <-sub.C:
		t.Errorf("unexpected event %v", ev.Type)
	default:
	}
}
