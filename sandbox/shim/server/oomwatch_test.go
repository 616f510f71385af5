package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestOOMCounterKeepsWhatItSaw plays the systemd driver's race on a plain
// file named memory.events (inotify reports its writes as the kernel's
// notifications of a cgroup's would be): the count rises, the file goes
// away before the exit is handled, and the kill is still known.
func TestOOMCounterKeepsWhatItSaw(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory.events")
	write := func(kills string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill "+kills+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("2")
	c := watchOOM(path)
	if c.killed() {
		t.Fatal("killed before any new OOM kill")
	}
	write("3")
	deadline := time.Now().Add(10 * time.Second)
	for c.seen.Load() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the watch did not see the count rise to 3 (seen %d)", c.seen.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if !c.killed() {
		t.Error("the OOM kill seen before the file went away is lost")
	}
}

// TestOOMCounterWithoutFile: no counter file (no memory controller) means
// no OOM kill, and a nil counter (a create that failed) too.
func TestOOMCounterWithoutFile(t *testing.T) {
	if watchOOM("").killed() || watchOOM(filepath.Join(t.TempDir(), "memory.events")).killed() {
		t.Error("an OOM kill without a counter")
	}
	var c *oomCounter
	if c.killed() {
		t.Error("a nil counter reports an OOM kill")
	}
}
