package snapshot

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// TestCommitsShareSyncs: commits that ask while a syncfs runs wait for the
// next one, which they share, and each gets the error of a sync that
// started after it asked.
func TestCommitsShareSyncs(t *testing.T) {
	s := newFSSyncer(t.TempDir())
	release := make(chan error)
	var calls []string
	var mu sync.Mutex
	s.syncfs = func(string) error {
		mu.Lock()
		calls = append(calls, "sync")
		mu.Unlock()
		return <-release
	}
	first := make(chan error)
	go func() { first <- s.sync() }()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 1 })

	// Three commits ask while the first sync runs: it may have missed
	// their files, so they need the next.
	later := make(chan error, 3)
	for range 3 {
		go func() { later <- s.sync() }()
	}
	waitFor(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.waiting[2] == 3 })
	release <- nil
	if err := <-first; err != nil {
		t.Fatalf("first commit: %v", err)
	}
	select {
	case err := <-later:
		t.Fatalf("a commit that asked during the first sync returned after it: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	boom := errors.New("I/O error")
	release <- boom // the second sync, shared by the three
	for range 3 {
		if err := <-later; !errors.Is(err, boom) {
			t.Errorf("commit covered by the failed sync got %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 {
		t.Errorf("%d syncs for four commits, want 2", len(calls))
	}
	if len(s.failed) != 0 || len(s.waiting) != 0 {
		t.Errorf("left behind: failed %v, waiting %v", s.failed, s.waiting)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}
