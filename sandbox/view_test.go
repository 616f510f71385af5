package sandbox

import (
	"errors"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func (m *Manager) addTestContainer(t testing.TB, id, podID string) {
	t.Helper()
	c := &Container{ID: id, PodID: podID, Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: id}}}
	if err := m.saveContainer(c); err != nil {
		t.Fatal(err)
	}
}

// TestViewStateOrder: a container's state never goes back, whatever order
// the shim's events and berthd's own replies come in, and each change is
// one event, in order, with the pod's containers as they were then.
func TestViewStateOrder(t *testing.T) {
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
	for _, want := range []runtimeapi.ContainerEventType{EventContainerStarted, EventContainerStopped} {
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

// TestSlowSubscriberDropped: a subscriber that reads nothing is dropped
// once its buffer is full, with an error saying so; the runtime goes on
// and other subscribers get every event.
func TestSlowSubscriberDropped(t *testing.T) {
	m := testManager(t)
	m.addTestPod(t, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil)
	slow, fast := m.Subscribe(), m.Subscribe()
	defer fast.Close()
	done := make(chan struct{})
	go func() { // publish returns whatever slow does
		defer close(done)
		for i := range SubscriberBuffer + 10 {
			m.publish(EventContainerStarted, "pod1", "pod1")
			if _, ok := <-fast.C; !ok {
				t.Errorf("fast subscriber dropped at event %d: %v", i, fast.Err())
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("publishing blocked on a slow subscriber")
	}
	n := 0
	for range slow.C {
		n++
	}
	if n != SubscriberBuffer || !errors.Is(slow.Err(), errkind.ResourceExhausted) {
		t.Errorf("slow subscriber: %d events then %v; want %d then errkind.ResourceExhausted", n, slow.Err(), SubscriberBuffer)
	}
}

// TestListsShareSnapshots: lists hand out the view's pods and statuses
// without copying them, and a change replaces them rather than changing
// what a caller already holds (a status's memo with it); GetPod gives a
// copy of its own.
func TestListsShareSnapshots(t *testing.T) {
	m := testManager(t)
	m.addTestPod(t, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil)
	m.addTestContainer(t, "ctr1", "pod1")
	pods, _ := m.ListPods(Filter{})
	ctrs, _ := m.ListContainers(t.Context(), Filter{})
	again, _ := m.ListContainers(t.Context(), Filter{PodID: "pod1"})
	if len(pods) != 1 || len(ctrs) != 1 || len(again) != 1 || again[0] != ctrs[0] {
		t.Fatalf("lists %v %v %v: want one pod, the same container status twice", pods, ctrs, again)
	}
	ctrs[0].Memo.Store("made of the created container")

	m.setContainerState("pod1", shim.State{ID: "ctr1", Status: shim.StatusRunning, Pid: 42})
	p, err := m.GetPod("pod1")
	if err != nil {
		t.Fatal(err)
	}
	p.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if err := m.savePod(p); err != nil {
		t.Fatal(err)
	}
	if ctrs[0].State != runtimeapi.ContainerState_CONTAINER_CREATED || pods[0].State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("listed before the changes: %v, %v; want them as they were (CREATED, READY)", ctrs[0].State, pods[0].State)
	}
	now, _ := m.ListContainers(t.Context(), Filter{})
	pods, _ = m.ListPods(Filter{})
	if now[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING || now[0].Pid != 42 || pods[0].State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("listed after: %v pid %d, %v; want RUNNING 42, NOTREADY", now[0].State, now[0].Pid, pods[0].State)
	}
	if got := now[0].Memo.Load(); got != nil {
		t.Errorf("the running container's status has the memo %v of the one before", got)
	}
}

// TestViewVersion: the version that node-wide lists are kept at changes
// with each pod or container stored, changed or removed, and not with a
// list.
func TestViewVersion(t *testing.T) {
	m := testManager(t)
	changes := versionCheck(t, m.Version)
	changes("pod created", true, func() { m.addTestPod(t, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil) })
	changes("container created", true, func() { m.addTestContainer(t, "ctr1", "pod1") })
	changes("lists", false, func() {
		if _, err := m.ListPods(Filter{}); err != nil {
			t.Fatal(err)
		}
		if _, err := m.ListContainers(t.Context(), Filter{}); err != nil {
			t.Fatal(err)
		}
	})
	changes("container exited", true, func() { m.state.setState(shim.State{ID: "ctr1", Status: shim.StatusStopped}) })
	changes("the same state again (a shim's snapshot)", false, func() { m.state.setState(shim.State{ID: "ctr1", Status: shim.StatusStopped}) })
	changes("container removed", true, func() {
		if err := m.deleteContainerRecord("ctr1"); err != nil {
			t.Fatal(err)
		}
	})
	changes("pod stopped", true, func() { m.addTestPod(t, "pod1", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, nil) })
	changes("pod removed", true, func() {
		if err := m.deletePodRecord("pod1"); err != nil {
			t.Fatal(err)
		}
	})
}

// versionCheck returns a check that do changes the version version returns
// (or, with change false, leaves it as it was).
func versionCheck(t *testing.T, version func() uint64) func(what string, change bool, do func()) {
	v := version()
	return func(what string, change bool, do func()) {
		t.Helper()
		do()
		if now := version(); (now != v) != change {
			t.Errorf("%s: version %d, was %d; want a change: %v", what, now, v, change)
		}
		v = version()
	}
}
