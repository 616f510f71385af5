package stats

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/berth-runtime/berth/sandbox/store/storetest"
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
	want := 4096 + folderBytes(t, dir)
	var l layerUsages
	if b, i := l.usage("c", func() string { return dir }, slog.Default()); b != 0 || i != 0 {
		t.Fatalf("first call = %d bytes, %d inodes; want none before the walk ends", b, i)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, i := l.usage("c", func() string { return dir }, slog.Default())
		if b == want && i == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage = %d bytes, %d inodes; want %d and 2 (the folder and its file)", b, i, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Fresh figures are not walked again: a new file shows only later.
	os.WriteFile(filepath.Join(dir, "g"), make([]byte, 4096), 0o644)
	if b, _ := l.usage("c", func() string { return dir }, slog.Default()); b != want {
		t.Errorf("usage within %v = %d bytes, want the cached %d", layerUsageMaxAge, b, want)
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
	st, root := storetest.Open(t), t.TempDir()
	x, err := New(Options{Store: st, Cgroups: noCgroups{}, ContainerRoot: root, LayerRoots: []string{root}, Logger: slog.Default(),
		UpperDir: func(c *store.Container) string { return filepath.Join(root, c.ID) }, LayerRoot: func(*store.Container) string { return root }})
	if err != nil {
		t.Fatal(err)
	}
	storetest.AddPod(t, st, "pod1", runtimeapi.PodSandboxState_SANDBOX_READY, nil)
	changes := storetest.VersionCheck(t, x.Version)
	dir := t.TempDir()
	changes("container created", true, func() { storetest.AddContainer(t, st, "ctr1", "pod1") })
	changes("container started", true, func() { st.SetState(shim.State{ID: "ctr1", Status: shim.StatusRunning, Pid: 5}) })
	changes("a sample", true, func() { x.usages.put("ctr1", "/p/ctr1", cgroups.Stats{Timestamp: time.Now()}) })
	changes("the next sample", true, func() { x.usages.put("ctr1", "/p/ctr1", cgroups.Stats{Timestamp: time.Now()}) })
	changes("stats read", false, func() {
		c, _, err := st.Container("ctr1")
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, ok, err := x.ContainerUsage(c); !ok || err != nil {
				t.Fatalf("ContainerUsage = %v, %v", ok, err)
			}
		}
		waitWalked(t, &x.layers, "ctr1")
	})
	u := &layerUsage{}
	x.layers.byID["ctr2"] = u
	changes("a layer's first figures", true, func() {
		os.WriteFile(filepath.Join(dir, "f"), make([]byte, 10), 0o644)
		x.layers.walk(u, dir, slog.Default())
	})
	changes("the same figures again", false, func() { x.layers.walk(u, dir, slog.Default()) })
	changes("a sample nobody asked for lately dropped", true, func() {
		s := x.usages.byID["ctr1"]
		s.askedAt = time.Now().Add(-statsInterest - time.Second)
		x.usages.watched(s.step)
	})
	changes("container removed", true, func() {
		if err := st.DeleteContainer("ctr1"); err != nil {
			t.Fatal(err)
		}
	})
}

// noCgroups has no cgroup to read: usage comes from the collector's samples.
type noCgroups struct{}

func (noCgroups) ContainerCgroupsPath(p, c string) string { return p + "/" + c }
func (noCgroups) Stats(string) (cgroups.Stats, error)     { return cgroups.Stats{}, os.ErrNotExist }
func (noCgroups) Details(string) (cgroups.Details, error) { return cgroups.Details{}, os.ErrNotExist }

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
	var folders uint64 // the folders' blocks, each taken once it is full
	blocks := func(fd int) {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		folders += uint64(st.Blocks) * 512
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
		blocks(fd)
		unix.Close(fd)
		fd = next
	}
	write(fd, "f1", 4096)
	write(fd, "f2", 8192)
	if err := unix.Linkat(fd, "f2", fd, "f2-link", 0); err != nil {
		t.Fatal(err)
	}
	blocks(fd)
	if _, err := os.Stat(filepath.Join(dir, strings.Repeat(name+"/", levels), "f1")); !errors.Is(err, unix.ENAMETOOLONG) {
		t.Fatalf("stat by path = %v, want ENAMETOOLONG (the chain must be deeper than PATH_MAX)", err)
	}

	before := openFDs(t)
	du, err := diskUsage(dir, layerWalkLimits)
	if err != nil {
		t.Fatal(err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after the walk, %d before", after, before)
	}
	wantInodes := uint64(1 + levels + 3 + 2) // the top, the chain, "beside" thrice, f1 and f2 once
	if want := 3 + 4096 + 8192 + folders; du.bytes != want || du.inodes != wantInodes || du.skipped != 0 || du.tooDeep != 0 {
		t.Errorf("diskUsage = %d bytes, %d inodes, %d skipped (%v), %d folders too deep; want %d, %d, none skipped",
			du.bytes, du.inodes, du.skipped, du.firstErr, du.tooDeep, want, wantInodes)
	}
}

// folderBytes is the space folder dir itself takes, as du counts it.
func folderBytes(t *testing.T, dir string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return uint64(st.Blocks) * 512
}

// duBytes is what du -s --block-size=1 says dir takes.
func duBytes(t *testing.T, dir string) uint64 {
	t.Helper()
	out, err := exec.Command("du", "-s", "--block-size=1", dir).Output()
	if err != nil {
		t.Fatalf("du: %v", err)
	}
	n, err := strconv.ParseUint(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		t.Fatalf("du said %q: %v", out, err)
	}
	return n
}

// writeTree makes under dir a folder of many long names (several blocks of
// folder, several reads of its names), nested folders, files whose sizes
// are whole blocks (so that their size is what du counts) and files with
// two names each (linked of them).
func writeTree(t testing.TB, dir string, linked int) {
	t.Helper()
	wide := filepath.Join(dir, "wide")
	deep := filepath.Join(dir, "a", "b", "c")
	for _, d := range []string{wide, deep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2000 {
		name := fmt.Sprintf("an-entry-with-a-name-long-enough-to-fill-blocks-%04d", i)
		if err := os.WriteFile(filepath.Join(wide, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(deep, "data"), make([]byte, 3*4096), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range linked {
		p := filepath.Join(deep, fmt.Sprintf("linked-%d", i))
		if err := os.WriteFile(p, make([]byte, 2*4096), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(p, filepath.Join(dir, "a", fmt.Sprintf("other-name-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiskUsageCountsFoldersAsDu: folders count their blocks, as du counts
// them: a folder of thousands of names is several blocks of disk, which a
// container could otherwise fill unseen. Files here are whole blocks, so
// the walk's total is du's.
func TestDiskUsageCountsFoldersAsDu(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, 3)
	if top, wide := folderBytes(t, dir), folderBytes(t, filepath.Join(dir, "wide")); top > 0 && wide <= top {
		t.Fatalf("the wide folder takes %d bytes, the top one %d: want several blocks", wide, top)
	}
	du, err := diskUsage(dir, layerWalkLimits)
	if err != nil {
		t.Fatal(err)
	}
	if want := duBytes(t, dir); du.bytes != want || du.skipped != 0 || du.tooDeep != 0 || du.linkShares != 0 {
		t.Errorf("diskUsage = %d bytes (skipped %d, too deep %d, shares %d); du -s --block-size=1 says %d",
			du.bytes, du.skipped, du.tooDeep, du.linkShares, want)
	}
	// The top, wide and its 2000, a, b, c, data, the linked files once.
	if want := uint64(1 + 1 + 2000 + 3 + 1 + 3); du.inodes != want {
		t.Errorf("diskUsage = %d inodes, want %d", du.inodes, want)
	}
}

// TestDiskUsageBounded: a walk remembers at most its limit of hard-linked
// files; past it each further name counts its share, so that the bytes stay
// du's. And a walk holds at most its limit of folders on its path: a folder
// deeper is counted, not its content, which the walk says, and everything
// beside the chain is still counted, with no descriptor left open.
func TestDiskUsageBounded(t *testing.T) {
	dir := t.TempDir()
	const linked, remembered = 10, 4
	writeTree(t, dir, linked)
	du, err := diskUsage(dir, walkLimits{linkedFiles: remembered, heldBytes: layerWalkLimits.heldBytes})
	if err != nil {
		t.Fatal(err)
	}
	if want := duBytes(t, dir); du.bytes != want || du.linkShares != 2*(linked-remembered) || du.tooDeep != 0 {
		t.Errorf("diskUsage past %d linked files = %d bytes, %d names by share, %d folders too deep; want du's %d, %d, none",
			remembered, du.bytes, du.linkShares, du.tooDeep, want, 2*(linked-remembered))
	}

	deep := t.TempDir()
	p := deep
	for range 40 {
		p = filepath.Join(p, "d")
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "bottom"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(deep, "beside"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	const depth = 10
	limits := walkLimits{linkedFiles: remembered, heldBytes: depth*frameBytes + maxReadHeld}
	if got := limits.maxDepth(); got != depth {
		t.Fatalf("maxDepth = %d, want %d", got, depth)
	}
	before := openFDs(t)
	du, err = diskUsage(deep, limits)
	if err != nil {
		t.Fatal(err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after the walk, %d before", after, before)
	}
	// The top, the folders down to the one too deep, and beside.
	var folders uint64
	for i := range depth + 1 {
		folders += folderBytes(t, filepath.Join(deep, strings.Repeat("d/", i)))
	}
	if du.tooDeep != 1 || du.inodes != depth+2 || du.bytes != folders+4096 {
		t.Errorf("a walk past its depth: %d bytes, %d inodes, %d folders too deep; want %d, %d, 1",
			du.bytes, du.inodes, du.tooDeep, folders+4096, depth+2)
	}
}

// TestWalkFrameWithinItsCount: what the walk counts against its limit for a
// folder on its path is at least what one takes.
func TestWalkFrameWithinItsCount(t *testing.T) {
	if size := unsafe.Sizeof(walkFrame{}); size > frameBytes {
		t.Errorf("a walkFrame takes %d bytes, the walk counts %d", size, frameBytes)
	}
	if size := unsafe.Sizeof(dirName{}); size > nameOverhead {
		t.Errorf("a dirName takes %d bytes, the walk counts %d", size, nameOverhead)
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

// writeHostileChain makes under dir a chain of levels folders, each holding
// beside the next one as many 255-byte names as one read of a folder's
// names returns, and at its bottom a file of bottom bytes (whole blocks, so
// that du counts its size). A walk that holds each folder's unvisited names
// while it is below it holds 16-32 KiB a level here (the next folder is
// made first, is read first in creation order (tmpfs), anywhere among the
// names in hash order (ext4)): a few hundred levels pass 16 MiB.
func writeHostileChain(t *testing.T, dir string, levels, bottom int) {
	t.Helper()
	const nameLen, direntLen = 255, 280 // a dirent of such a name, aligned
	perLevel := namesBufSize/direntLen - 1
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { unix.Close(fd) }()
	for range levels {
		next := strings.Repeat("d", nameLen)
		if err := unix.Mkdirat(fd, next, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range perLevel {
			name := fmt.Sprintf("%05d%s", i, strings.Repeat("n", nameLen-5))
			f, err := unix.Openat(fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(f)
		}
		nfd, err := unix.Openat(fd, next, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = nfd
	}
	f, err := unix.Openat(fd, "bottom", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(f)
	if _, err := unix.Write(f, make([]byte, bottom)); err != nil {
		t.Fatal(err)
	}
}

// TestDiskUsageHostileChainCounted: a chain of folders full of long names,
// which a walk holding every unvisited name on its path cannot hold within
// its bound, is counted whole, with the big file at its bottom and the one
// beside its top: past the bound the walk sheds the names held by the
// highest folders and reads them again on its way back up, so a container
// cannot hide its disk use from eviction behind such a chain.
func TestDiskUsageHostileChainCounted(t *testing.T) {
	dir := t.TempDir()
	const levels, heldBytes = 100, 512 << 10 // ~1.5 MiB of names held unshed
	writeHostileChain(t, dir, levels, 4<<20)
	if err := os.WriteFile(filepath.Join(dir, "beside"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)
	du, err := diskUsage(dir, walkLimits{linkedFiles: layerWalkLimits.linkedFiles, heldBytes: heldBytes})
	if err != nil {
		t.Fatal(err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after the walk, %d before", after, before)
	}
	perLevel := uint64(namesBufSize/280 - 1)
	wantInodes := 1 + levels*(perLevel+1) + 2 // the top, each level's names and folder, bottom and beside
	if want := duBytes(t, dir); du.bytes != want || du.inodes != wantInodes || du.skipped != 0 || du.tooDeep != 0 {
		t.Errorf("diskUsage = %d bytes, %d inodes, %d skipped (%v), %d folders too deep; du -s --block-size=1 says %d, want %d inodes, none skipped",
			du.bytes, du.inodes, du.skipped, du.firstErr, du.tooDeep, want, wantInodes)
	}
	if du.shed == 0 {
		t.Errorf("the walk shed no names: the chain never passed its bound of %d bytes", heldBytes)
	}
	assertHeldWithin(t, du, heldBytes)
	t.Logf("%d bytes, %d inodes, %d names shed and read again", du.bytes, du.inodes, du.shed)
}

// assertHeldWithin checks that a walk held at most heldBytes of path and
// names at once, and one read of names more.
func assertHeldWithin(t *testing.T, du layerFigures, heldBytes int) {
	t.Helper()
	if du.peakHeld > heldBytes+maxReadHeld {
		t.Errorf("the walk held %d bytes of path and names at once, past its bound of %d and one read (%d)", du.peakHeld, heldBytes, maxReadHeld)
	}
}
