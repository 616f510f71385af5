package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/sandbox/shim"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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
	step := c.byID["c1"].step
	if w := c.watched(step); len(w) != 1 || w[0] != (watchedCgroup{"c1", "/p"}) {
		t.Errorf("watched(%d) = %v, want [{c1 /p}]", step, w)
	}
	c.byID["c1"].askedAt = time.Now().Add(-statsInterest - time.Second)
	if w := c.watched(step); len(w) != 0 {
		t.Errorf("watched = %v after the interest passed, want none", w)
	}
	if _, ok := c.get("c1"); ok {
		t.Error("a cgroup nobody watches still has a sample")
	}
}

// TestUsageCacheSteps: the collector reads each cgroup in the same step of
// every period (its rate is over a whole period), and each step reads an
// equal share.
func TestUsageCacheSteps(t *testing.T) {
	var c usageCache
	ids := map[string]bool{}
	for i := range 3 * statsSteps {
		id := fmt.Sprint("c", i)
		ids[id] = true
		c.put(id, "/"+id, cgroups.Stats{Timestamp: time.Now()})
	}
	for range 2 { // a second sample of each keeps its step
		seen := map[string]bool{}
		for step := range statsSteps {
			w := c.watched(step)
			if len(w) != 3 {
				t.Errorf("step %d reads %v, want 3 cgroups", step, w)
			}
			for _, x := range w {
				if seen[x.id] {
					t.Errorf("%s read twice in a period", x.id)
				}
				seen[x.id] = true
				c.put(x.id, x.path, cgroups.Stats{Timestamp: time.Now()})
			}
		}
		if len(seen) != len(ids) {
			t.Errorf("a period read %d cgroups, want %d", len(seen), len(ids))
		}
	}
}

// TestUsageMemo: what a caller keeps in a sample's memo serves every call
// until the next sample, which starts empty.
func TestUsageMemo(t *testing.T) {
	var c usageCache
	c.put("c1", "/p", cgroups.Stats{Timestamp: time.Now()})
	u, _ := c.get("c1")
	u.Memo.Store("made of sample 1")
	if u, _ := c.get("c1"); u.Memo.Load() != "made of sample 1" {
		t.Errorf("memo of the same sample = %v", u.Memo.Load())
	}
	c.put("c1", "/p", cgroups.Stats{Timestamp: time.Now()})
	if u, _ := c.get("c1"); u.Memo.Load() != nil {
		t.Errorf("memo of the next sample = %v, want none", u.Memo.Load())
	}
}

// TestStatsVersion: the version that node-wide stats answers are kept at
// changes with each container added, changed or removed, each sample the
// collector stores or drops and each new writable-layer figure, and with
// nothing else: reading stats does not change it.
func TestStatsVersion(t *testing.T) {
	m := testManager(t)
	m.opts.Cgroups = &fakeCgroups{live: map[string]bool{}}
	m.addTestPod(t, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil)
	changes := versionCheck(t, m.StatsVersion)
	dir := t.TempDir()
	changes("container created", true, func() { m.addTestContainer(t, "ctr1", "pod1") })
	changes("container started", true, func() { m.state.setState(shim.State{ID: "ctr1", Status: shim.StatusRunning, Pid: 5}) })
	changes("a sample", true, func() { m.usages.put("ctr1", "/p/ctr1", cgroups.Stats{Timestamp: time.Now()}) })
	changes("the next sample", true, func() { m.usages.put("ctr1", "/p/ctr1", cgroups.Stats{Timestamp: time.Now()}) })
	changes("stats read", false, func() {
		c, _, err := m.state.container("ctr1")
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, ok, err := m.ContainerUsage(c); !ok || err != nil {
				t.Fatalf("ContainerUsage = %v, %v", ok, err)
			}
		}
		waitWalked(t, &m.layers, "ctr1")
	})
	u := &layerUsage{}
	m.layers.byID["ctr2"] = u
	changes("a layer's first figures", true, func() {
		os.WriteFile(filepath.Join(dir, "f"), make([]byte, 10), 0o644)
		m.layers.walk(u, dir, slog.Default())
	})
	changes("the same figures again", false, func() { m.layers.walk(u, dir, slog.Default()) })
	changes("a sample nobody asked for lately dropped", true, func() {
		s := m.usages.byID["ctr1"]
		s.askedAt = time.Now().Add(-statsInterest - time.Second)
		m.usages.watched(s.step)
	})
	changes("container removed", true, func() {
		if err := m.deleteContainerRecord("ctr1"); err != nil {
			t.Fatal(err)
		}
	})
}

// waitWalked waits for the background walk of id's writable layer to end.
func waitWalked(t *testing.T, l *layerUsages, id string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		l.mu.Lock()
		u := l.byID[id]
		done := u != nil && !u.walking
		l.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the walk of %s's layer did not end", id)
		}
	}
}

// TestDiskUsageDeeperThanPathMax: a container's chain of folders deeper
// than PATH_MAX is counted whole (a path-based walk fails with
// ENAMETOOLONG and the layer's figures would stay frozen), with the files at
// its bottom, a hard-linked file once, and no descriptor left open.
func TestDiskUsageDeeperThanPathMax(t *testing.T) {
	dir := t.TempDir()
	const levels, name = 2 * maxWalkFDs, "a-folder-name-of-fifty-characters-to-pass-PATH_MAX"
	if levels*(len(name)+1) <= unix.PathMax {
		t.Fatalf("the chain is only %d bytes long", levels*(len(name)+1))
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { unix.Close(fd) }()
	write := func(fd int, file string, size int) {
		f, err := unix.Openat(fd, file, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(f)
		if _, err := unix.Write(f, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range levels {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		// Beside the chain at the first levels: visited after coming back
		// up through folders whose descriptors were closed on the way down.
		if i < 3 {
			write(fd, "beside", 1)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = next
	}
	write(fd, "f1", 4096)
	write(fd, "f2", 8192)
	if err := unix.Linkat(fd, "f2", fd, "f2-link", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, strings.Repeat(name+"/", levels), "f1")); !errors.Is(err, unix.ENAMETOOLONG) {
		t.Fatalf("stat by path = %v, want ENAMETOOLONG (the chain must be deeper than PATH_MAX)", err)
	}

	before := openFDs(t)
	du, err := diskUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after the walk, %d before", after, before)
	}
	wantInodes := uint64(1 + levels + 3 + 2) // the top, the chain, "beside" thrice, f1 and f2 once
	if du.bytes != 3+4096+8192 || du.inodes != wantInodes || du.skipped != 0 {
		t.Errorf("diskUsage = %d bytes, %d inodes, %d skipped (%v); want %d, %d, 0",
			du.bytes, du.inodes, du.skipped, du.firstErr, 3+4096+8192, wantInodes)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}
