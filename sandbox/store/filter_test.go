package store_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/berth-runtime/berth/sandbox/store/storetest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestListPodsFilter: IDs are full or unique prefixes; an ambiguous one is
// errkind.Invalid saying so, one of nothing lists nothing; state and labels AND.
func TestListPodsFilter(t *testing.T) {
	s := storetest.Open(t)
	storetest.AddPod(t, s, "aa11", runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"app": "x"})
	storetest.AddPod(t, s, "aa22", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, map[string]string{"app": "y"})
	storetest.AddPod(t, s, "bb33", runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"app": "x", "k": ""})
	notReady := int32(runtimeapi.PodSandboxState_SANDBOX_NOTREADY)
	for _, c := range []struct {
		name string
		f    store.Filter
		want []string
	}{
		{"all", store.Filter{}, []string{"aa11", "aa22", "bb33"}},
		{"full", store.Filter{ID: "aa22"}, []string{"aa22"}},
		{"prefix", store.Filter{ID: "b"}, []string{"bb33"}},
		{"none", store.Filter{ID: "cc"}, nil},
		{"state", store.Filter{State: &notReady}, []string{"aa22"}},
		{"label", store.Filter{Labels: map[string]string{"app": "x"}}, []string{"aa11", "bb33"}},
		{"empty-label", store.Filter{Labels: map[string]string{"k": ""}}, []string{"bb33"}},
		{"prefix-and-label", store.Filter{ID: "aa1", Labels: map[string]string{"app": "y"}}, nil},
	} {
		pods, err := s.ListPods(c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var ids []string
		for _, p := range pods {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, c.want) {
			t.Errorf("%s: %v, want %v", c.name, ids, c.want)
		}
	}
	_, err := s.ListPods(store.Filter{ID: "aa"})
	if !errors.Is(err, errkind.Invalid) || !strings.Contains(err.Error(), `"aa" is ambiguous`) {
		t.Errorf("ambiguous prefix: %v, want errkind.Invalid saying so", err)
	}
}
