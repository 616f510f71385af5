package atomicfile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestWriteWhole: readers racing 500 replacements see one content or the
// other, never a part, and no temp file is left.
func TestWriteWhole(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "hosts")
	a, b := bytes.Repeat([]byte("a"), 64<<10), bytes.Repeat([]byte("b"), 32<<10)
	if err := Write(p, a, 0o600); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad atomic.Value
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				got, err := os.ReadFile(p)
				if err != nil || !(bytes.Equal(got, a) || bytes.Equal(got, b)) {
					bad.Store(fmt.Sprintf("read %d bytes, %v", len(got), err))
					return
				}
			}
		})
	}
	for i := range 500 {
		data := a
		if i%2 == 0 {
			data = b
		}
		if err := Write(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatalf("a reader saw a partial file: %v", v)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temp files left: %v", entries)
	}
}

// TestWriteOwned: the file has the mode asked for, whatever the umask,
// and the owner.
func TestWriteOwned(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := WriteOwned(p, []byte("x"), 0o644, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if st.Mode().Perm() != 0o644 || sys.Uid != 1234 || sys.Gid != 5678 {
		t.Errorf("mode %v, owner %d:%d, want 0644, 1234:5678", st.Mode().Perm(), sys.Uid, sys.Gid)
	}
}

// TestWriteFailedLeavesNothing: a rename refused (a folder is in the way)
// fails the write, leaves the folder and no temp file.
func TestWriteFailedLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "lease")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("x"), 0o600); err == nil {
		t.Fatal("a write over a folder succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || !entries[0].IsDir() {
		t.Errorf("left in the folder: %v", entries)
	}
}
