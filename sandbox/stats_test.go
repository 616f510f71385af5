package sandbox

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cgroups"
)

// TestLayerUsagesInBackground: a stats call never walks the layer itself; it
// answers with the last figures, which a background walk fills in.
func TestLayerUsagesInBackground(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	var l layerUsages
	if b, i := l.usage("c", func() string { return dir }, slog.Default()); b != 0 || i != 0 {
		t.Fatalf("first call = %d bytes, %d inodes; want none before the walk ends", b, i)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, i := l.usage("c", func() string { return dir }, slog.Default())
		if b == 4096 && i == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage = %d bytes, %d inodes; want 4096 and 2 (the folder and its file)", b, i)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Fresh figures are not walked again: a new file shows only later.
	os.WriteFile(filepath.Join(dir, "g"), make([]byte, 4096), 0o644)
	if b, _ := l.usage("c", func() string { return dir }, slog.Default()); b != 4096 {
		t.Errorf("usage within %v = %d bytes, want the cached 4096", layerUsageMaxAge, b)
	}
	l.forget("c")
	if _, ok := l.byID["c"]; ok {
		t.Error("forget kept the figures")
	}
}

// TestUsageCacheRate: the CPU rate is over the collector's period, from
// its last two samples; a cgroup nobody asked for within statsInterest is
// no longer sampled.
func TestUsageCacheRate(t *testing.T) {
	var c usageCache
	t0 := time.Now()
	u := c.put("c1", "/p", cgroups.Stats{Timestamp: t0, CPUUsageNanos: 1e9})
	if u.CPUNanoCores != 0 {
		t.Errorf("first sample: rate %d, want 0", u.CPUNanoCores)
	}
	c.put("c1", "/p", cgroups.Stats{Timestamp: t0.Add(statsPeriod), CPUUsageNanos: 1e9 + 5e8})
	if u, ok := c.get("c1"); !ok || u.CPUNanoCores != 5e8 || u.CPUUsageNanos != 1e9+5e8 {
		t.Errorf("get = %+v, %v; want half a core, the last counter", u, ok)
	}
	if w := c.watched(); len(w) != 1 || w[0] != (watchedCgroup{"c1", "/p"}) {
		t.Errorf("watched = %v, want [{c1 /p}]", w)
	}
	c.byID["c1"].askedAt = time.Now().Add(-statsInterest - time.Second)
	if w := c.watched(); len(w) != 0 {
		t.Errorf("watched = %v after the interest passed, want none", w)
	}
	if _, ok := c.get("c1"); ok {
		t.Error("a cgroup nobody watches still has a sample")
	}
}
