package content

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
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
	p, err := s.OpenPartial(context.Background(), d, 10, nobody)
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
	p, err = s.OpenPartial(context.Background(), d, 10, nobody)
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
	p, _ := s.OpenPartial(context.Background(), d, 100, nobody)
	if _, err := p.WriteAt([]byte("abc"), 0); err != nil {
		t.Fatal(err)
	}
	p.Checkpoint(50) // more than the file holds (a power cut lost the rest)
	p.Close()
	p, _ = s.OpenPartial(context.Background(), d, 100, nobody)
	if p.Offset() != 3 {
		t.Errorf("offset %d, want the 3 bytes the file holds", p.Offset())
	}
	p.Close()
	if err := os.WriteFile(s.partialPath(d)+offsetSuffix, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ = s.OpenPartial(context.Background(), d, 100, nobody)
	if p.Offset() != 0 {
		t.Errorf("offset %d from a torn offset file, want 0", p.Offset())
	}
	p.Close()
}

func TestPartialOneDownloadAtATime(t *testing.T) {
	s, d, p := heldPartial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.OpenPartial(ctx, d, 10, nobody); err == nil {
		t.Fatal("a second download of the same blob opened its partial file")
	}
	got := make(chan error, 1)
	go func() {
		q, err := s.OpenPartial(context.Background(), d, 10, nobody)
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

// nobody is a download whose waits' progress the test ignores; all of
// them have one source.
var nobody = Downloader{Source: "registry.test/repo", Clock: new(atomic.Int64), Progressed: func() {}}

// TestPartialWaiterFollowsHolder: a download waiting for another's
// partial file counts that download's progress clock as its own, and only
// it (a holder whose clock stands gives the waiter none, so the
// waiter's own progress timeout ends the wait); its own context ends the
// wait too.
func TestPartialWaiterFollowsHolder(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("blob")
	holder := Downloader{Source: nobody.Source, Clock: new(atomic.Int64)}
	p, err := s.OpenPartial(context.Background(), d, 1<<20, holder)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	progressed := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := s.OpenPartial(ctx, d, 1<<20, Downloader{Source: nobody.Source, Clock: new(atomic.Int64), Progressed: func() {
			select {
			case progressed <- struct{}{}:
			default:
			}
		}})
		waited <- err
	}()
	select {
	case <-progressed:
		t.Fatal("the waiter was told of progress while the holder wrote nothing")
	case <-time.After(3 * followEvery):
	}
	holder.Clock.Add(1)
	select {
	case <-progressed:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's clock moved, and the waiter was not told of progress")
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
		p, err := s.OpenPartial(context.Background(), d, 10, nobody)
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

// TestPartialBoundedBySize: no byte is written past the size the partial
// file was opened with, so the file never grows past the blob.
func TestPartialBoundedBySize(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.OpenPartial(context.Background(), digest.FromString("blob"), 10, nobody)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.WriteAt([]byte("0123456789"), 0); err != nil {
		t.Fatalf("a write of the whole blob: %v", err)
	}
	for _, off := range []int64{1, 10, 1 << 40, -1} {
		if n, err := p.WriteAt([]byte("0123456789"), off); !errors.Is(err, ErrPastSize) || n != 0 {
			t.Errorf("a write of 10 bytes at %d into a 10-byte blob: %d, %v; want 0, ErrPastSize", off, n, err)
		}
	}
	if fi, err := os.Stat(s.partialPath(digest.FromString("blob"))); err != nil || fi.Size() != 10 {
		t.Errorf("the partial file: %v, %v; want 10 bytes", fi, err)
	}
}

// TestRemoveIdlePartials: asked to free them all (maxAge 0), the store
// removes every partial download but the one a download holds, which it
// goes on writing.
func TestRemoveIdlePartials(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	idle, busy := digest.FromString("idle"), digest.FromString("busy")
	p, err := s.OpenPartial(context.Background(), idle, 10, nobody)
	if err != nil {
		t.Fatal(err)
	}
	p.WriteAt([]byte("x"), 0)
	p.Checkpoint(1)
	p.Close()
	q, err := s.OpenPartial(context.Background(), busy, 10, nobody)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	q.WriteAt([]byte("x"), 0)
	q.Checkpoint(1)
	if err := s.RemoveStalePartials(0); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{s.partialPath(idle), s.partialPath(idle) + offsetSuffix} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s is still there", f)
		}
	}
	for _, f := range []string{s.partialPath(busy), s.partialPath(busy) + offsetSuffix} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the held download's %s: %v", f, err)
		}
	}
	if _, err := q.WriteAt([]byte("y"), 1); err != nil {
		t.Errorf("the held download writes on: %v", err)
	}
}

// TestUsageCountsPartials: the partial downloads are counted in Usage, by
// what they hold on the disk (a part written far ahead leaves a hole).
func TestUsageCountsPartials(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	before, inodesBefore, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	p, err := s.OpenPartial(context.Background(), digest.FromString("blob"), size, nobody)
	if err != nil {
		t.Fatal(err)
	}
	part := make([]byte, 1<<20)
	if _, err := p.WriteAt(part, size-int64(len(part))); err != nil { // the last part, ahead of a hole
		t.Fatal(err)
	}
	p.Checkpoint(0)
	p.Close()
	after, inodes, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if grew := after - before; grew < 1<<20 || grew > 2<<20 {
		t.Errorf("Usage grew by %d bytes with a partial download holding 1 MiB at the end of a 64 MiB hole; want about 1 MiB", grew)
	}
	if inodes <= inodesBefore {
		t.Errorf("Usage counts %d files with the partial download, %d without", inodes, inodesBefore)
	}
}

// heldPartial opens a store and the partial file of a 10-byte blob d,
// held by nobody's download.
func heldPartial(t *testing.T) (*Store, digest.Digest, *Partial) {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("blob")
	p, err := s.OpenPartial(context.Background(), d, 10, nobody)
	if err != nil {
		t.Fatal(err)
	}
	return s, d, p
}

// TestPartialOtherSourceGetsPrivateFile: a download from another source
// than the holder's does not wait: it writes into a file of its own, which
// goes when it closes, and the holder's file stays as it was.
func TestPartialOtherSourceGetsPrivateFile(t *testing.T) {
	s, d, p := heldPartial(t)
	defer p.Close()
	if _, err := p.WriteAt([]byte("held"), 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Checkpoint(4); err != nil {
		t.Fatal(err)
	}
	other := Downloader{Source: "mirror.test/repo", Clock: new(atomic.Int64), Progressed: func() {}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := s.OpenPartial(ctx, d, 10, other)
	if err != nil {
		t.Fatalf("another source's download waited for the held file: %v", err)
	}
	if q.Offset() != 0 || q.f.Name() == p.f.Name() {
		t.Fatalf("another source's download got %s at offset %d, want a file of its own at 0", q.f.Name(), q.Offset())
	}
	if _, err := q.WriteAt([]byte("0123456789"), 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Checkpoint(10); err != nil {
		t.Fatal(err)
	}
	private := q.f.Name()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(private); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the private file outlived its download: %v", err)
	}
	if saved, err := readOffset(p.f.Name() + offsetSuffix); err != nil || saved != 4 {
		t.Fatalf("the holder's offset is %d (%v), want 4", saved, err)
	}
}

// TestDropPartial: a partial download no download holds goes, with its
// offset; one a download holds stays.
func TestDropPartial(t *testing.T) {
	s, d, p := heldPartial(t)
	if err := p.Checkpoint(0); err != nil {
		t.Fatal(err)
	}
	path := p.f.Name()
	if err := s.DropPartial(d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a held partial file was dropped: %v", err)
	}
	p.Close()
	if err := s.DropPartial(d); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, path + offsetSuffix} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s stayed: %v", f, err)
		}
	}
}
