package spec

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
)

// TestResolveHostPath: symlinks are resolved; a missing path is the
// caller's fault; a path whose last lookup still hangs is not looked at
// again (its goroutine would pile up beside the first).
func TestResolveHostPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(dir, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if got, fi, err := resolveHostPath("pod-a", "mount /data: host_path", filepath.Join(dir, "link")); err != nil || got != dir || !fi.IsDir() {
		t.Errorf("resolveHostPath(link) = %q, %v, %v; want %q, a folder", got, fi, err, dir)
	}
	missing := filepath.Join(dir, "missing")
	if _, _, err := resolveHostPath("pod-a", "mount /data: host_path", missing); !errors.Is(err, errkind.Invalid) ||
		!strings.Contains(err.Error(), "mount /data: host_path \""+missing+"\" does not exist") {
		t.Errorf("missing: %v, want invalid naming the mount", err)
	}

	hung := filepath.Join(dir, "hung")
	// A lookup begun longer ago than the timeout that has not answered.
	hanging := &hostLookup{started: time.Now().Add(-2 * hostPathTimeout), pod: "pod-a", done: make(chan struct{})}
	setHostLookups(t, map[string]*hostLookup{hung: hanging})
	if _, _, err := resolveHostPath("pod-b", "mount /data: host_path", hung); !errors.Is(err, errkind.DeadlineExceeded) ||
		!strings.Contains(err.Error(), hung) {
		t.Errorf("a path whose lookup hangs: %v, want deadline exceeded naming it", err)
	}
}

// TestResolveHostPathBoundPerPod: once maxHungLookupsPerPod lookups of one
// pod hang, that pod's next new path is refused, and only that pod's:
// another pod's host paths are still looked at (#34, finding 4: the bound
// was the node's, and one pod on a hung server failed every other pod's
// CreateContainer). An answered lookup counts no more.
func TestResolveHostPathBoundPerPod(t *testing.T) {
	dir := t.TempDir()
	setHostLookups(t, hungLookups(dir, "pod-a", maxHungLookupsPerPod))
	_, _, err := resolveHostPath("pod-a", "mount /data: host_path", dir)
	if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), "pod-a") {
		t.Errorf("pod-a with %d lookups hanging: %v, want resource exhausted naming the pod", maxHungLookupsPerPod, err)
	}
	for range 2 { // the second: pod-b's answered lookup no longer counts
		if got, _, err := resolveHostPath("pod-b", "mount /data: host_path", dir); err != nil || got != dir {
			t.Errorf("pod-b beside pod-a's %d hung lookups = %q, %v; want %q", maxHungLookupsPerPod, got, err, dir)
		}
	}
	hostLookups.Lock()
	left := len(hostLookups.paths)
	hostLookups.Unlock()
	if left != maxHungLookupsPerPod {
		t.Errorf("%d lookups unanswered after pod-b's answered, want pod-a's %d", left, maxHungLookupsPerPod)
	}
}

// TestResolveHostPathBoundNodeWide: the node's unanswered lookups, each an
// OS thread stuck in the kernel, stop at maxHungLookups whichever pods
// began them (a removed pod's included): berthd dies at Go's 10000 threads.
func TestResolveHostPathBoundNodeWide(t *testing.T) {
	dir := t.TempDir()
	paths := map[string]*hostLookup{}
	for i := range maxHungLookups / maxHungLookupsPerPod {
		maps.Copy(paths, hungLookups(filepath.Join(dir, fmt.Sprint(i)), fmt.Sprint("pod-", i), maxHungLookupsPerPod))
	}
	setHostLookups(t, paths)
	_, _, err := resolveHostPath("pod-new", "mount /data: host_path", dir)
	if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), "of the node") {
		t.Errorf("a new pod beside %d hung lookups: %v, want resource exhausted naming the node's bound", maxHungLookups, err)
	}
}

// hungLookups are n lookups of pod under dir that never answer.
func hungLookups(dir, pod string, n int) map[string]*hostLookup {
	paths := map[string]*hostLookup{}
	for i := range n {
		paths[filepath.Join(dir, "hung", fmt.Sprint(i))] = &hostLookup{started: time.Now(), pod: pod, done: make(chan struct{})}
	}
	return paths
}

// TestResolveHostPathAgain looks at one host path many times in a row, as
// a container with two mounts of one folder does: a lookup that has
// answered must not count as hanging for the next.
func TestResolveHostPathAgain(t *testing.T) {
	dir := t.TempDir()
	for i := range 2000 {
		if _, _, err := resolveHostPath("pod-a", "mount /data: host_path", dir); err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
}

// TestResolveHostPathShared: a lookup of a path whose lookup another pod
// began a moment ago waits for that lookup's answer and gets it, rather
// than being refused as hanging.
func TestResolveHostPathShared(t *testing.T) {
	dir := t.TempDir()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	under := &hostLookup{started: time.Now(), pod: "pod-a", done: make(chan struct{})}
	setHostLookups(t, map[string]*hostLookup{dir: under})
	go func() {
		time.Sleep(100 * time.Millisecond)
		under.resolved, under.fi = dir, fi
		hostLookups.Lock()
		delete(hostLookups.paths, dir)
		hostLookups.Unlock()
		close(under.done)
	}()
	got, gotFI, err := resolveHostPath("pod-b", "mount /data: host_path", dir)
	if err != nil || got != dir || gotFI != fi {
		t.Errorf("resolveHostPath during another's lookup = %q, %v, %v; want %q and that lookup's answer", got, gotFI, err, dir)
	}
}

// setHostLookups makes paths the lookups under way until the test ends.
func setHostLookups(t *testing.T, paths map[string]*hostLookup) {
	hostLookups.Lock()
	defer hostLookups.Unlock()
	maps.Copy(hostLookups.paths, paths)
	t.Cleanup(func() {
		hostLookups.Lock()
		defer hostLookups.Unlock()
		clear(hostLookups.paths)
	})
}
