package content

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

func TestPartialKeepsItsCheckpointAcrossOpens(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("blob")
	p, err := s.OpenPartial(context.Background(), d, 10)
	if err != nil || p.Offset() != 0 {
		t.Fatalf("first open: offset %v, %v", p, err)
	}
	if _, err := p.WriteAt([]byte("abcdefgh"), 0); err != nil {
		t.Fatal(err)
	}
	// Bytes past the checkpoint were written but not recorded as complete.
	if err := p.Checkpoint(5); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart: a new Store on the same root keeps the partial download.
	s, err = Open(root)
	if err != nil {
		t.Fatal(err)
	}
	p, err = s.OpenPartial(context.Background(), d, 10)
	if err != nil || p.Offset() != 5 {
		t.Fatalf("reopened: offset %d, %v; want 5", p.Offset(), err)
	}
	if err := p.Remove(); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, s.partialDir())
}

func TestPartialOffsetNeverPastTheData(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("blob")
	p, _ := s.OpenPartial(context.Background(), d, 100)
	if _, err := p.WriteAt([]byte("abc"), 0); err != nil {
		t.Fatal(err)
	}
	p.Checkpoint(50) // more than the file holds (a power cut lost the rest)
	p.Close()
	p, _ = s.OpenPartial(context.Background(), d, 100)
	if p.Offset() != 3 {
		t.Errorf("offset %d, want the 3 bytes the file holds", p.Offset())
	}
	p.Close()
	if err := os.WriteFile(s.partialPath(d)+offsetSuffix, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ = s.OpenPartial(context.Background(), d, 100)
	if p.Offset() != 0 {
		t.Errorf("offset %d from a torn offset file, want 0", p.Offset())
	}
	p.Close()
}

func TestPartialOneDownloadAtATime(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("blob")
	p, err := s.OpenPartial(context.Background(), d, 10)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.OpenPartial(ctx, d, 10); err == nil {
		t.Fatal("a second download of the same blob opened its partial file")
	}
	got := make(chan error, 1)
	go func() {
		q, err := s.OpenPartial(context.Background(), d, 10)
		if err == nil {
			q.Close()
		}
		got <- err
	}()
	p.Close()
	if err := <-got; err != nil {
		t.Fatalf("the waiting download: %v", err)
	}
}

func TestRemoveStalePartials(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	old, fresh, busy := digest.FromString("old"), digest.FromString("fresh"), digest.FromString("busy")
	for _, d := range []digest.Digest{old, fresh, busy} {
		p, err := s.OpenPartial(context.Background(), d, 10)
		if err != nil {
			t.Fatal(err)
		}
		p.WriteAt([]byte("x"), 0)
		p.Checkpoint(1)
		if d != busy {
			p.Close()
		}
	}
	past := time.Now().Add(-2 * PartialMaxAge)
	for _, d := range []digest.Digest{old, busy} {
		for _, f := range []string{s.partialPath(d), s.partialPath(d) + offsetSuffix} {
			if err := os.Chtimes(f, past, past); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.RemoveStalePartials(PartialMaxAge); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(s.partialDir())
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := map[string]bool{filepath.Base(s.partialPath(fresh)): true, filepath.Base(s.partialPath(fresh)) + offsetSuffix: true,
		filepath.Base(s.partialPath(busy)): true, filepath.Base(s.partialPath(busy)) + offsetSuffix: true}
	if len(left) != len(want) {
		t.Fatalf("left %v, want the fresh and the busy partial downloads", left)
	}
	for _, n := range left {
		if !want[n] {
			t.Errorf("left %s", n)
		}
	}
}
