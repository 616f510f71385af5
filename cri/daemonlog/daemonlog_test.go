package daemonlog

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The log rotates before a write that would take it past its bound,
// keeping one previous file; a file too big already rotates at the first
// write; a single write longer than the bound goes whole into a file of
// its own; and the descriptors it was given follow the current file.
func TestRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lazyd.log")
	if err := os.WriteFile(path, bytes.Repeat([]byte("o"), 90), 0o600); err != nil { // no newline: a line a crash cut
		t.Fatal(err)
	}
	stderr, err := unix.Open(os.DevNull, unix.O_WRONLY, 0) // a stand-in for the process's stderr
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(stderr)
	l, err := Open(path, 100, []int{stderr})
	if err != nil {
		t.Fatal(err)
	}
	line := func(c byte, n int) []byte { return append(bytes.Repeat([]byte{c}, n-1), '\n') }
	write := func(p []byte) {
		t.Helper()
		if n, err := l.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v; want %d", n, err, len(p))
		}
	}
	files := func(cur, prev []byte) {
		t.Helper()
		for p, want := range map[string][]byte{path: cur, path + ".1": prev} {
			if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s = %q, %v; want %q", filepath.Base(p), got, err, want)
			}
		}
	}

	write(line('a', 20)) // 90 + 20 > 100: the file it found goes
	files(line('a', 20), bytes.Repeat([]byte("o"), 90))
	write(line('b', 60))
	files(append(line('a', 20), line('b', 60)...), bytes.Repeat([]byte("o"), 90))
	if _, err := unix.Write(stderr, line('p', 10)); err != nil { // a panic's trace, say
		t.Fatal(err)
	}
	write(line('c', 30)) // 90 + 30 > 100
	files(line('c', 30), append(append(line('a', 20), line('b', 60)...), line('p', 10)...))
	if _, err := unix.Write(stderr, line('q', 10)); err != nil {
		t.Fatal(err)
	}
	files(append(line('c', 30), line('q', 10)...), append(append(line('a', 20), line('b', 60)...), line('p', 10)...))
	write(line('d', 150))
	write(line('e', 10))
	files(line('e', 10), line('d', 150))
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the new file: %v, %v; want mode 0600", fi.Mode(), err)
	}
}

// A log file gone from its path (removed by hand, or renamed by a
// rotation whose open failed) is started anew at the next rotation rather
// than written on past the bound: its rename fails, not the rotation.
func TestRotationOfAFileGone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lazyd.log")
	l, err := Open(path, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write(bytes.Repeat([]byte("a"), 90)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write([]byte("past the bound\n")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "past the bound\n" {
		t.Fatalf("%s = %q, %v; want a new file holding the write", filepath.Base(path), got, err)
	}
}
