package content

import (
	"context"
	"errors"
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
	p, err := s.OpenPartial(context.Background(), d, 10, nothing)
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
	p, err = s.OpenPartial(context.Background(), d, 10, nothing)
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
	p, _ := s.OpenPartial(context.Background(), d, 100, nothing)
	if _, err := p.WriteAt([]byte("abc"), 0); err != nil {
		t.Fatal(err)
	}
	p.Checkpoint(50) // more than the file holds (a power cut lost the rest)
	p.Close()
	p, _ = s.OpenPartial(context.Background(), d, 100, nothing)
	if p.Offset() != 3 {
		t.Errorf("offset %d, want the 3 bytes the file holds", p.Offset())
	}
	p.Close()
	if err := os.WriteFile(s.partialPath(d)+offsetSuffix, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ = s.OpenPartial(context.Background(), d, 100, nothing)
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
	p, err := s.OpenPartial(context.Background(), d, 10, nothing)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.OpenPartial(ctx, d, 10, nothing); err == nil {
		t.Fatal("a second download of the same blob opened its partial file")
	}
	got := make(chan error, 1)
	go func() {
		q, err := s.OpenPartial(context.Background(), d, 10, nothing)
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

// nothing is the progress callback of a wait whose progress the test ignores.
func nothing() {}

// TestPartialWaiterFollowsHolder: a download waiting for another's
// partial file counts that download's writes as its progress, and only
// them (a holder that writes nothing gives the waiter none, so the
// waiter's own progress timeout ends the wait); its own context ends the
// wait too.
func TestPartialWaiterFollowsHolder(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("blob")
	p, err := s.OpenPartial(context.Background(), d, 1<<20, nothing)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	progressed := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := s.OpenPartial(ctx, d, 1<<20, func() {
			select {
			case progressed <- struct{}{}:
			default:
			}
		})
		waited <- err
	}()
	select {
	case <-progressed:
		t.Fatal("the waiter was told of progress while the holder wrote nothing")
	case <-time.After(3 * followEvery):
	}
	if _, err := p.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-progressed:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder wrote, and the waiter was not told of progress")
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter's wait ended with %v, want its own context's cancellation", err)
	}
}

func TestRemoveStalePartials(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	old, fresh, busy := digest.FromString("old"), digest.FromString("fresh"), digest.FromString("busy")
	for _, d := range []digest.Digest{old, fresh, busy} {
		p, err := s.OpenPartial(context.Background(), d, 10, nothing)
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
