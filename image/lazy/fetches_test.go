package lazy

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
)

// testQuiet is the quiet period of these tests: long enough that a
// background request that did not wait for it would start well before.
const testQuiet = 300 * time.Millisecond

// TestFetchesHoldWhileDemand: a background request does not start while an
// on-demand fetch runs, however long it runs, nor until the quiet period
// after it ended. "However long" is shown by where the request waits, not
// by a time: it waits without a timer, so only a change of demand ends
// the wait.
func TestFetchesHoldWhileDemand(t *testing.T) {
	f := NewFetches(1, testQuiet)
	waits := make(chan bool, 1)
	f.waits = func(timed bool) {
		select {
		case waits <- timed:
		default: // the first is the one looked at
		}
	}
	done := f.Demand()
	acquired := make(chan time.Time, 1)
	go func() {
		if err := f.acquire(context.Background()); err != nil {
			t.Error(err)
		}
		acquired <- time.Now()
	}()
	select {
	case at := <-acquired:
		t.Fatalf("a background slot was given at %v while demand was under way", at)
	case timed := <-waits:
		if timed {
			t.Fatal("the background request waits on a timer while demand is under way: it starts when the timer fires, demand or not")
		}
	case <-time.After(time.Minute):
		t.Fatal("the background request neither waited nor started")
	}
	ended := time.Now()
	done()
	if at := <-acquired; at.Before(ended.Add(testQuiet)) {
		t.Fatalf("a background slot was given %v after demand ended, want at least %v", at.Sub(ended), testQuiet)
	}
	f.release()
}

// TestBackgroundFetchWaitsForQuietReads: the background fetch of a layer
// whose file was just read on demand starts its first request no earlier
// than the quiet period after that read began, and still completes the
// layer.
func TestBackgroundFetchWaitsForQuietReads(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<10) // 16 KiB: four chunks
	blob, toc := build(t, tarOf(t, [2]string{"prio", "first"}, [2]string{estargz.PrefetchLandmark, "\x0f"},
		[2]string{"small", "read on demand"}, [2]string{"big", big}))
	var mu sync.Mutex
	var background bool
	var starts []time.Time // of the background requests
	src, b := serveThrough(t, blob, func(_ http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if background && strings.Contains(r.URL.Path, "/blobs/sha256:") && r.Method == http.MethodGet {
			starts = append(starts, time.Now())
		}
		return false
	})
	b.TOCDigest, b.DiffID = toc, diffID(t, blob)
	dir := t.TempDir()
	if _, _, err := Prepare(context.Background(), dir, src, b, Options{}); err != nil {
		t.Fatal(err)
	}
	l, err := Load(dir, src, Options{Fetches: NewFetches(2, testQuiet), Broken: func(err error) { t.Errorf("Broken: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	readBegan := time.Now()
	if got, err := readAll(l, "small"); err != nil || string(got) != "read on demand" {
		t.Fatalf("small on demand: %q, %v", got, err)
	}
	mu.Lock()
	background = true
	mu.Unlock()
	l.Complete()
	l.background.Wait()
	if !IsComplete(dir) {
		t.Fatal("the layer did not complete")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) == 0 {
		t.Fatal("the background fetch made no request")
	}
	if first := starts[0]; first.Before(readBegan.Add(testQuiet)) {
		t.Fatalf("the first background request started %v after the on-demand read began, want at least %v", first.Sub(readBegan), testQuiet)
	}
}
