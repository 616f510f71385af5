package spec

import (
	"errors"
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
	hanging := &hostLookup{started: time.Now().Add(-2 * hostPathTimeout), pod: &podLookups{unanswered: 1}, done: make(chan struct{})}
	setHostLookups(t, map[string]*hostLookup{hung: hanging}, nil)
	if _, _, err := resolveHostPath("pod-b", "mount /data: host_path", hung); !errors.Is(err, errkind.DeadlineExceeded) ||
		!strings.Contains(err.Error(), hung) {
		t.Errorf("a path whose lookup hangs: %v, want deadline exceeded naming it", err)
	}
}

// TestResolveHostPathBoundPerPod: once maxHungLookupsPerPod lookups of one
// pod hang, that pod's next new path is refused, and only that pod's:
// another pod's host paths are still looked at (#34, finding 4: the bound
// was the node's, and one pod on a hung server failed every other pod's
// CreateContainer). The counts go when the lookups answer, and with the pod.
func TestResolveHostPathBoundPerPod(t *testing.T) {
	dir := t.TempDir()
	hungPod := &podLookups{unanswered: maxHungLookupsPerPod}
	paths := map[string]*hostLookup{}
	for i := range maxHungLookupsPerPod {
		paths[filepath.Join(dir, "hung", string(rune('a'+i)))] = &hostLookup{started: time.Now(), pod: hungPod, done: make(chan struct{})}
	}
	setHostLookups(t, paths, map[string]*podLookups{"pod-a": hungPod})

	_, _, err := resolveHostPath("pod-a", "mount /data: host_path", dir)
	if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), "pod-a") {
		t.Errorf("pod-a with %d lookups hanging: %v, want resource exhausted naming the pod", maxHungLookupsPerPod, err)
	}
	if got, _, err := resolveHostPath("pod-b", "mount /data: host_path", dir); err != nil || got != dir {
		t.Errorf("pod-b beside pod-a's %d hung lookups = %q, %v; want %q", maxHungLookupsPerPod, got, err, dir)
	}
	hostLookups.Lock()
	_, counted := hostLookups.pods["pod-b"]
	hostLookups.Unlock()
	if counted {
		t.Error("pod-b's answered lookup is still counted")
	}
	ForgetPod("pod-a")
	hostLookups.Lock()
	_, counted = hostLookups.pods["pod-a"]
	hostLookups.Unlock()
	if counted {
		t.Error("pod-a is still counted once forgotten")
	}
}

// setHostLookups makes paths and pods the lookups under way until the
// test ends.
func setHostLookups(t *testing.T, paths map[string]*hostLookup, pods map[string]*podLookups) {
	hostLookups.Lock()
	defer hostLookups.Unlock()
	for p, l := range paths {
		hostLookups.paths[p] = l
	}
	for p, c := range pods {
		hostLookups.pods[p] = c
	}
	t.Cleanup(func() {
		hostLookups.Lock()
		defer hostLookups.Unlock()
		clear(hostLookups.paths)
		clear(hostLookups.pods)
	})
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
	under := &hostLookup{started: time.Now(), pod: &podLookups{unanswered: 1}, done: make(chan struct{})}
	setHostLookups(t, map[string]*hostLookup{dir: under}, nil)
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
