package store_test

import (
	"fmt"
	"testing"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/berth-runtime/berth/sandbox/store/storetest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The list calls' cost in the store, without root or gRPC, on a node of
// 250 pods of 2 containers (make bench measures the whole CRI call).

func BenchmarkListContainers500(b *testing.B) {
	s := storetest.Open(b)
	for i := range 250 {
		pod := fmt.Sprintf("%064d", i)
		storetest.AddPod(b, s, pod, runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"a": "b", "c": "d"})
		for j := range 2 {
			id := fmt.Sprintf("%062d%02d", i, j)
			storetest.AddContainer(b, s, id, pod)
			s.SetState(shim.State{ID: id, Status: shim.StatusRunning, Pid: 5})
		}
	}
	b.ResetTimer()
	for range b.N {
		l, _ := s.ListStatuses(store.Filter{})
		if len(l) != 500 {
			b.Fatal(len(l))
		}
	}
}

func BenchmarkListPods250(b *testing.B) {
	s := storetest.Open(b)
	for i := range 250 {
		pod := fmt.Sprintf("%064d", i)
		storetest.AddPod(b, s, pod, runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"a": "b", "c": "d"})
	}
	b.ResetTimer()
	for range b.N {
		l, _ := s.ListPods(store.Filter{})
		if len(l) != 250 {
			b.Fatal(len(l))
		}
	}
}
