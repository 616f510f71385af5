package sandbox

import (
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	bolt "go.etcd.io/bbolt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testManager is a Manager on a fresh database, without root: what it
// knows of pods and containers is their records.
func testManager(t testing.TB) *Manager {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{podsBucket, containersBucket} {
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return &Manager{opts: Options{DB: db, State: t.TempDir(), Root: t.TempDir()}, log: slog.New(slog.DiscardHandler),
		shims: map[string]*shim.Client{}, state: newView()}
}

func (m *Manager) addTestPod(t testing.TB, id string, state runtimeapi.PodSandboxState, labels map[string]string) {
	t.Helper()
	p := &Pod{ID: id, State: state, Config: &runtimeapi.PodSandboxConfig{Labels: labels,
		Metadata: &runtimeapi.PodSandboxMetadata{Name: id, Namespace: "ns", Uid: id}}}
	if err := m.savePod(p); err != nil {
		t.Fatal(err)
	}
}

// TestListPodsFilter: IDs are full or unique prefixes; an ambiguous one is
// errkind.Invalid saying so, one of nothing lists nothing; state and labels AND.
func TestListPodsFilter(t *testing.T) {
	m := testManager(t)
	m.addTestPod(t, "aa11", runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"app": "x"})
	m.addTestPod(t, "aa22", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, map[string]string{"app": "y"})
	m.addTestPod(t, "bb33", runtimeapi.PodSandboxState_SANDBOX_READY, map[string]string{"app": "x", "k": ""})
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
		pods, err := m.ListPods(c.f)
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
	_, err := m.ListPods(Filter{ID: "aa"})
	if !errors.Is(err, errkind.Invalid) || !strings.Contains(err.Error(), `"aa" is ambiguous`) {
		t.Errorf("ambiguous prefix: %v, want errkind.Invalid saying so", err)
	}
}
