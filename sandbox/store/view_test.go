package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/berth-runtime/berth/sandbox/store/storetest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSlowSubscriberDropped: a subscriber that reads nothing is dropped
// once its buffer is full, with an error saying so; the runtime goes on
// and other subscribers get every event.
func TestSlowSubscriberDropped(t *testing.T) {
	s := storetest.Open(t)
	storetest.AddPod(t, s, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil)
	slow, fast := s.Subscribe(), s.Subscribe()
	defer fast.Close()
	done := make(chan struct{})
	go func() { // publish returns whatever slow does
		defer close(done)
		for i := range store.SubscriberBuffer + 10 {
			s.Publish(store.EventContainerStarted, "pod1", "pod1")
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
	if n != store.SubscriberBuffer || !errors.Is(slow.Err(), errkind.ResourceExhausted) {
		t.Errorf("slow subscriber: %d events then %v; want %d then errkind.ResourceExhausted", n, slow.Err(), store.SubscriberBuffer)
	}
}

// TestListsShareSnapshots: lists hand out the view's pods and statuses
// without copying them, and a change replaces them rather than changing
// what a caller already holds (a status's memo with it); GetPod gives a
// copy of its own.
func TestListsShareSnapshots(t *testing.T) {
	s := storetest.Open(t)
	storetest.AddPod(t, s, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil)
	storetest.AddContainer(t, s, "ctr1", "pod1")
	pods, _ := s.ListPods(store.Filter{})
	ctrs, _ := s.ListStatuses(store.Filter{})
	again, _ := s.ListStatuses(store.Filter{PodID: "pod1"})
	if len(pods) != 1 || len(ctrs) != 1 || len(again) != 1 || again[0] != ctrs[0] {
		t.Fatalf("lists %v %v %v: want one pod, the same container status twice", pods, ctrs, again)
	}
	ctrs[0].Memo.Store("made of the created container")

	s.SetState(shim.State{ID: "ctr1", Status: shim.StatusRunning, Pid: 42})
	p, err := s.Pod("pod1")
	if err != nil {
		t.Fatal(err)
	}
	p.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if err := s.SavePod(p); err != nil {
		t.Fatal(err)
	}
	if ctrs[0].State != runtimeapi.ContainerState_CONTAINER_CREATED || pods[0].State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("listed before the changes: %v, %v; want them as they were (CREATED, READY)", ctrs[0].State, pods[0].State)
	}
	now, _ := s.ListStatuses(store.Filter{})
	pods, _ = s.ListPods(store.Filter{})
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
	s := storetest.Open(t)
	changes := storetest.VersionCheck(t, s.Version)
	changes("pod created", true, func() { storetest.AddPod(t, s, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil) })
	changes("container created", true, func() { storetest.AddContainer(t, s, "ctr1", "pod1") })
	changes("lists", false, func() {
		if _, err := s.ListPods(store.Filter{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ListStatuses(store.Filter{}); err != nil {
			t.Fatal(err)
		}
	})
	changes("container exited", true, func() { s.SetState(shim.State{ID: "ctr1", Status: shim.StatusStopped}) })
	changes("the same state again (a shim's snapshot)", false, func() { s.SetState(shim.State{ID: "ctr1", Status: shim.StatusStopped}) })
	changes("container removed", true, func() {
		if err := s.DeleteContainer("ctr1"); err != nil {
			t.Fatal(err)
		}
	})
	changes("pod stopped", true, func() { storetest.AddPod(t, s, "pod1", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, nil) })
	changes("pod removed", true, func() {
		if err := s.DeletePod("pod1"); err != nil {
			t.Fatal(err)
		}
	})
}
