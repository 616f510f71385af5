package store

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	bolt "go.etcd.io/bbolt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testStore is a Store on a fresh database.
func testStore(t testing.TB) *Store {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := Open(db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *Store) addTestPod(t testing.TB, id string, state runtimeapi.PodSandboxState, labels map[string]string) {
	t.Helper()
	p := &Pod{ID: id, State: state, Config: &runtimeapi.PodSandboxConfig{Labels: labels,
		Metadata: &runtimeapi.PodSandboxMetadata{Name: id, Namespace: "ns", Uid: id}}}
	if err := s.SavePod(p); err != nil {
		t.Fatal(err)
	}
}

// TestListPodsFilter: IDs are full or unique prefixes; an ambiguous one is
// errkind.Invalid saying so, one of nothing lists nothing; state and labels AND.
func TestListPodsFilter(t *testing.T) {
	s := testStore(t)
	s.addTestPod(t, "aa11", runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"app": "x"})
	s.addTestPod(t, "aa22", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, map[string]string{"app": "y"})
	s.addTestPod(t, "bb33", runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"app": "x", "k": ""})
	notReady := int32(runtimeapi.PodSandboxState_SANDBOX_NOTREADY)
	for _, c := range []struct {
		name string
		f    Filter
		want []string
	}{
		{"all", Filter{}, []string{"aa11", "aa22", "bb33"}},
		{"full", Filter{ID: "aa22"}, []string{"aa22"}},
		{"prefix", Filter{ID: "b"}, []string{"bb33"}},
		{"none", Filter{ID: "cc"}, nil},
		{"state", Filter{State: &notReady}, []string{"aa22"}},
		{"label", Filter{Labels: map[string]string{"app": "x"}}, []string{"aa11", "bb33"}},
		{"empty-label", Filter{Labels: map[string]string{"k": ""}}, []string{"bb33"}},
		{"prefix-and-label", Filter{ID: "aa1", Labels: map[string]string{"app": "y"}}, nil},
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
	_, err := s.ListPods(Filter{ID: "aa"})
	if !errors.Is(err, errkind.Invalid) || !strings.Contains(err.Error(), `"aa" is ambiguous`) {
		t.Errorf("ambiguous prefix: %v, want errkind.Invalid saying so", err)
	}
}
