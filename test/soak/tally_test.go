package soak

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/berth-runtime/berth/test/harness"
)

// tally collects what the workers see as they go: each cycle's shim, read
// while its container runs or has just ended (a new shim must be as big as
// the ones before it: one that inherits berthd's growing state is not), and
// how long each kind of call took.
type tally struct {
	mu        sync.Mutex
	shimRSS   []float64 // MiB, the cycles' shims since the last sample
	shimFDs   []int
	latencies map[string][]time.Duration // by kind: "pod cycle", "ExecSync", …
}

// shim records the RSS and open files of a cycle's shim.
func (t *tally) shim(pid int) error {
	rss, err := harness.ProcessRSS(pid)
	if err != nil {
		return fmt.Errorf("shim %d: %w", pid, err)
	}
	fds, err := harness.OpenFDs(pid)
	if err != nil {
		return fmt.Errorf("shim %d: %w", pid, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.shimRSS = append(t.shimRSS, mib(rss))
	t.shimFDs = append(t.shimFDs, fds)
	return nil
}

// takeShims returns the mean RSS and the most open files of the cycles'
// shims recorded since the last call, and forgets them.
func (t *tally) takeShims() (meanRSS float64, maxFDs int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.shimRSS {
		meanRSS += r / float64(len(t.shimRSS))
	}
	for _, f := range t.shimFDs {
		maxFDs = max(maxFDs, f)
	}
	t.shimRSS, t.shimFDs = nil, nil
	return meanRSS, maxFDs
}

// time records how long a call of kind took since start.
func (t *tally) time(kind string, start time.Time) {
	d := time.Since(start)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.latencies == nil {
		t.latencies = map[string][]time.Duration{}
	}
	t.latencies[kind] = append(t.latencies[kind], d)
}

// printLatencies prints each kind's count, median and 99th percentile.
func (t *tally) printLatencies() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, kind := range []string{"pod cycle", "ExecSync", "exec SPDY", "exec WebSocket", "attach SPDY", "attach WebSocket"} {
		ds := slices.Clone(t.latencies[kind])
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		pct := func(p int) time.Duration { return ds[(len(ds)-1)*p/100].Round(time.Millisecond) }
		fmt.Printf("soak latency %-16s n=%d p50=%s p99=%s max=%s\n", kind, len(ds), pct(50), pct(99), pct(100))
	}
}
