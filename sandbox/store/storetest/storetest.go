// Package storetest makes stores and records for the tests of the store
// and of the packages that read it.
package storetest

import (
	"path/filepath"
	"testing"

	"github.com/berth-runtime/berth/sandbox/store"
	bolt "go.etcd.io/bbolt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Open returns a store on a fresh database.
func Open(t testing.TB) *store.Store {
	t.Helper()
	s, err := store.Open(OpenDB(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// OpenDB returns a fresh database, closed when t ends.
func OpenDB(t testing.TB) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// AddPod saves a pod named, namespaced and with a UID after its ID.
func AddPod(t testing.TB, s *store.Store, id string, state runtimeapi.PodSandboxState, labels map[string]string) {
	t.Helper()
	p := &store.Pod{ID: id, State: state, Config: &runtimeapi.PodSandboxConfig{Labels: labels,
		Metadata: &runtimeapi.PodSandboxMetadata{Name: id, Namespace: "ns", Uid: id}}}
	if err := s.SavePod(p); err != nil {
		t.Fatal(err)
	}
}

// AddContainer saves a container of pod podID named after its ID.
func AddContainer(t testing.TB, s *store.Store, id, podID string) {
	t.Helper()
	c := &store.Container{ID: id, PodID: podID, Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: id}}}
	if err := s.SaveContainer(c); err != nil {
		t.Fatal(err)
	}
}

// VersionCheck returns a check that do changes the version version returns
// (or, with change false, leaves it as it was).
func VersionCheck(t *testing.T, version func() uint64) func(what string, change bool, do func()) {
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
