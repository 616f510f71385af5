package snapshot

import (
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func openStore(t *testing.T, root string) (*Store, *bolt.DB) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(root, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(filepath.Join(root, "snapshots"), db)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

func TestCommitGetRemove(t *testing.T) {
	root := t.TempDir()
	s, db := openStore(t, root)
	defer db.Close()
	dir, err := s.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Commit("sha256:aaa", dir, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Name != "1" {
		t.Errorf("first snapshot named %q, want a short numeric name", snap.Name)
	}
	got, ok, err := s.Get("sha256:aaa")
	if err != nil || !ok || got != snap {
		t.Fatalf("Get = %+v %v %v", got, ok, err)
	}
	if b, err := os.ReadFile(filepath.Join(s.Dir(got), "hello")); err != nil || string(b) != "hi" {
		t.Errorf("content: %q %v", b, err)
	}
	dir2, _ := s.Prepare()
	if _, err := s.Commit("sha256:aaa", dir2, 0, 0); err == nil {
		t.Error("second commit of one chain ID succeeded")
	}
	if err := s.Abort(dir2); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("sha256:aaa"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("sha256:aaa"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "snapshots")); len(entries) != 0 {
		t.Errorf("folders left: %v", entries)
	}
}

func TestOpenReconciles(t *testing.T) {
	root := t.TempDir()
	s, db := openStore(t, root)
	kept, _ := s.Prepare()
	snap, err := s.Commit("sha256:kept", kept, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	gone, _ := s.Prepare()
	goneSnap, err := s.Commit("sha256:gone", gone, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Dir(s.Dir(goneSnap))) // record without folder
	if _, err := s.Prepare(); err != nil {      // unfinished unpack
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "snapshots", "99", "fs"), 0o755) // folder without record
	db.Close()

	s, db = openStore(t, root)
	defer db.Close()
	all, err := s.List()
	if err != nil || len(all) != 1 || all[0] != snap {
		t.Fatalf("after reconcile: %+v %v", all, err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "snapshots"))
	if len(entries) != 1 || entries[0].Name() != snap.Name {
		t.Errorf("folders after reconcile: %v", entries)
	}
}
