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
// again (its goroutine would pile up beside the first), nor any path once
// maxHungLookups hang.
func TestResolveHostPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(dir, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if got, fi, err := resolveHostPath("mount /data: host_path", filepath.Join(dir, "link")); err != nil || got != dir || !fi.IsDir() {
		t.Errorf("resolveHostPath(link) = %q, %v, %v; want %q, a folder", got, fi, err, dir)
	}
	missing := filepath.Join(dir, "missing")
	if _, _, err := resolveHostPath("mount /data: host_path", missing); !errors.Is(err, errkind.Invalid) ||
		!strings.Contains(err.Error(), "mount /data: host_path \""+missing+"\" does not exist") {
		t.Errorf("missing: %v, want invalid naming the mount", err)
	}

	hung := filepath.Join(dir, "hung")
	// A lookup begun longer ago than the timeout that has not answered.
	hanging := &hostLookup{started: time.Now().Add(-2 * hostPathTimeout), done: make(chan struct{})}
	hostLookups.Lock()
	hostLookups.paths[hung] = hanging
	hostLookups.Unlock()
	defer func() {
		hostLookups.Lock()
		clear(hostLookups.paths)
		hostLookups.Unlock()
	}()
	if _, _, err := resolveHostPath("mount /data: host_path", hung); !errors.Is(err, errkind.DeadlineExceeded) ||
		!strings.Contains(err.Error(), hung) {
		t.Errorf("a path whose lookup hangs: %v, want deadline exceeded naming it", err)
	}
	hostLookups.Lock()
	for i := range maxHungLookups {
		hostLookups.paths[filepath.Join(dir, "hung", string(rune('a'+i)))] = hanging
	}
	hostLookups.Unlock()
	if _, _, err := resolveHostPath("mount /data: host_path", dir); !errors.Is(err, errkind.ResourceExhausted) {
		t.Errorf("with %d lookups hanging: %v, want resource exhausted", maxHungLookups, err)
	}
}

// TestResolveHostPathAgain looks at one host path many times in a row, as
// a container with two mounts of one folder does: a lookup that has
// answered must not count as hanging for the next.
func TestResolveHostPathAgain(t *testing.T) {
	dir := t.TempDir()
	for i := range 2000 {
		if _, _, err := resolveHostPath("mount /data: host_path", dir); err != nil {
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
	under := &hostLookup{started: time.Now(), done: make(chan struct{})}
	hostLookups.Lock()
	hostLookups.paths[dir] = under
	hostLookups.Unlock()
	defer func() {
		hostLookups.Lock()
		clear(hostLookups.paths)
		hostLookups.Unlock()
	}()
	go func() {
		time.Sleep(100 * time.Millisecond)
		under.resolved, under.fi = dir, fi
		hostLookups.Lock()
		delete(hostLookups.paths, dir)
		hostLookups.Unlock()
		close(under.done)
	}()
	got, gotFI, err := resolveHostPath("mount /data: host_path", dir)
	if err != nil || got != dir || gotFI != fi {
		t.Errorf("resolveHostPath during another's lookup = %q, %v, %v; want %q and that lookup's answer", got, gotFI, err, dir)
	}
}
