package snapshot

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func openStore(t *testing.T, root string) (*Store, *bolt.DB) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(root, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := Open(filepath.Join(root, "snapshots"), db, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close) // before db.Close: cleanups run last first
	return s, db
}

func TestCommitGetRemove(t *testing.T) {
	root := t.TempDir()
	s, _ := openStore(t, root)
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
	s.Close()
	db.Close()

	s, _ = openStore(t, root)
	all, err := s.List()
	if err != nil || len(all) != 1 || all[0] != snap {
		t.Fatalf("after reconcile: %+v %v", all, err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "snapshots"))
	if len(entries) != 1 || entries[0].Name() != snap.Name {
		t.Errorf("folders after reconcile: %v", entries)
	}
}

// TestCommitsAreFlushedTogether: commits are recorded at once, marked
// unsynced, and one syncfs after they went quiet makes them all durable.
func TestCommitsAreFlushedTogether(t *testing.T) {
	root := t.TempDir()
	s, db := openStore(t, root)
	var syncs atomic.Int32
	s.flush.quiet, s.flush.syncfs = 50*time.Millisecond, func() error { syncs.Add(1); return nil }
	for _, c := range []string{"sha256:a", "sha256:b", "sha256:c"} {
		dir, err := s.Prepare()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(c, dir, 0, 0); err != nil {
			t.Fatal(err)
		}
		if rec := readRecord(t, db, c); rec.UnsyncedBoot != s.boot {
			t.Errorf("%s committed with boot %q, want %q (this boot) until synced", c, rec.UnsyncedBoot, s.boot)
		}
	}
	for _, c := range []string{"sha256:a", "sha256:b", "sha256:c"} {
		waitUntil(t, func() bool { return readRecord(t, db, c).UnsyncedBoot == "" })
	}
	if n := syncs.Load(); n != 1 {
		t.Errorf("%d syncfs calls for three commits in a row, want 1", n)
	}
}

// TestOpenSettlesUnsyncedSnapshots: after a crash before the flush, a
// snapshot of this boot is synced and kept (the page cache still holds its
// files), one of an earlier boot is dropped (they may be torn).
func TestOpenSettlesUnsyncedSnapshots(t *testing.T) {
	root := t.TempDir()
	s, db := openStore(t, root)
	s.flush.quiet = time.Hour // the flush never comes
	var snaps []Snapshot
	for _, c := range []string{"sha256:thisboot", "sha256:lastboot"} {
		dir, err := s.Prepare()
		if err != nil {
			t.Fatal(err)
		}
		snap, err := s.Commit(c, dir, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap)
	}
	// The crash: no flush ran; and the second was unpacked in an earlier boot.
	s.flush.mu.Lock()
	clear(s.flush.pending)
	s.flush.mu.Unlock()
	s.Close()
	rec := readRecord(t, db, "sha256:lastboot")
	rec.UnsyncedBoot = "an earlier boot"
	if err := db.Update(func(tx *bolt.Tx) error { return putRecord(tx.Bucket(bucket), rec) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, db = openStore(t, root)
	if got := readRecord(t, db, "sha256:thisboot"); got.Snapshot != snaps[0] || got.UnsyncedBoot != "" {
		t.Errorf("this boot's snapshot after Open: %+v, want %+v, synced", got, snaps[0])
	}
	if _, ok, err := s.Get("sha256:lastboot"); ok || err != nil {
		t.Errorf("the earlier boot's unsynced snapshot survived Open (%v)", err)
	}
	if _, err := os.Stat(filepath.Dir(s.Dir(snaps[1]))); !os.IsNotExist(err) {
		t.Errorf("its folder: %v, want it removed", err)
	}
}

func readRecord(t *testing.T, db *bolt.DB, chainID string) record {
	t.Helper()
	var rec record
	err := db.View(func(tx *bolt.Tx) error {
		r, ok, err := getRecord(tx.Bucket(bucket), chainID)
		if !ok && err == nil {
			err = fmt.Errorf("no record of %s", chainID)
		}
		rec = r
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestFailedFlushIsRetried: a syncfs that fails leaves its snapshots
// unsynced, and the flush after the next commit covers them too.
func TestFailedFlushIsRetried(t *testing.T) {
	s, db := openStore(t, t.TempDir())
	var syncs atomic.Int32
	s.flush.quiet = 10 * time.Millisecond
	s.flush.syncfs = func() error {
		if syncs.Add(1) == 1 {
			return errors.New("I/O error")
		}
		return nil
	}
	commit := func(chainID string) {
		t.Helper()
		dir, err := s.Prepare()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(chainID, dir, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	commit("sha256:first")
	waitUntil(t, func() bool { return syncs.Load() == 1 })
	time.Sleep(50 * time.Millisecond) // what the failed flush does after its syncfs
	if rec := readRecord(t, db, "sha256:first"); rec.UnsyncedBoot == "" {
		t.Fatal("marked synced by a syncfs that failed")
	}
	commit("sha256:second")
	waitUntil(t, func() bool {
		return readRecord(t, db, "sha256:first").UnsyncedBoot == "" && readRecord(t, db, "sha256:second").UnsyncedBoot == ""
	})
	if n := syncs.Load(); n != 2 {
		t.Errorf("%d syncfs calls, want 2", n)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("not within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
