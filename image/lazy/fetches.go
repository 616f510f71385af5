package lazy

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Fetches are the node's background fetches: a bound on the requests they
// make at a time, all layers together, and a hold that keeps them off the
// link and the CPU while a container or a pull waits for bytes. A
// background request starts only once no on-demand fetch has run for the
// quiet period: a read that has to fetch (Demand), a pull's fetch of a
// layer's prioritised files (berthd fetches those, not the layer server
// that owns this: the server holds a Demand for each while berthd renews
// its lease, image/lazyd), or a mark (Note) of a layer mounted or of a
// pull asking for its layers' background fetch. The requests in flight
// when demand comes finish; the next ones wait. Demand that never pauses holds the background fetch for as
// long as it lasts (as stargz-snapshotter does): the reads fetch what
// they need meanwhile, and the layer completes once the node is quiet.
type Fetches struct {
	slots *semaphore.Weighted
	quiet time.Duration // 0: no hold

	mu      sync.Mutex
	active  int           // on-demand fetches under way
	last    time.Time     // when demand last ended
	changed chan struct{} // closed and replaced whenever demand starts or ends

	// waits, if set (by tests), is told of each wait of a background
	// request as it begins: whether a timer can end it, or only a change
	// of demand.
	waits func(timed bool)
}

// NewFetches bounds background requests to n at a time (at least 1), each
// held until demand has been quiet for quiet.
func NewFetches(n int, quiet time.Duration) *Fetches {
	return &Fetches{slots: semaphore.NewWeighted(int64(max(n, 1))), quiet: quiet, changed: make(chan struct{})}
}

// Demand marks an on-demand fetch under way until done is called. A nil
// Fetches (a pull's layer, before the server has it) marks nothing.
func (f *Fetches) Demand() (done func()) {
	if f == nil {
		return func() {}
	}
	f.mu.Lock()
	f.active++
	f.signalLocked()
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		f.active--
		f.last = time.Now()
		f.signalLocked()
		f.mu.Unlock()
	}
}

// Note marks demand that has no duration of its own: a layer mounted, a
// pull that just fetched its layers' prioritised files.
func (f *Fetches) Note() { f.Demand()() }

func (f *Fetches) signalLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// acquire takes a slot for one background request once demand has been
// quiet for the quiet period; release gives it back.
func (f *Fetches) acquire(ctx context.Context) error {
	if err := f.slots.Acquire(ctx, 1); err != nil {
		return err
	}
	if err := f.waitQuiet(ctx); err != nil {
		f.slots.Release(1)
		return err
	}
	return nil
}

func (f *Fetches) release() { f.slots.Release(1) }

// waitQuiet returns once no demand is under way and the last ended at
// least the quiet period ago: it sleeps until then, or until demand
// starts or ends, and looks again.
func (f *Fetches) waitQuiet(ctx context.Context) error {
	for {
		f.mu.Lock()
		changed, active, left := f.changed, f.active > 0, time.Until(f.last.Add(f.quiet))
		f.mu.Unlock()
		if f.quiet == 0 || !active && left <= 0 {
			return nil
		}
		if err := f.sleepUntilChange(ctx, changed, active, left); err != nil {
			return err
		}
	}
}

// sleepUntilChange waits for changed, and, when no demand is under way,
// for the rest of the quiet period at most.
func (f *Fetches) sleepUntilChange(ctx context.Context, changed <-chan struct{}, active bool, left time.Duration) error {
	var timeout <-chan time.Time
	if !active {
		t := time.NewTimer(left)
		defer t.Stop()
		timeout = t.C
	}
	if f.waits != nil {
		f.waits(timeout != nil)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-changed:
	case <-timeout:
	}
	return nil
}
