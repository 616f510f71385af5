package content

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
)

func TestPutGetDelete(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"schemaVersion":2}`)
	d := digest.FromBytes(data)
	if err := s.Put(d, data); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(d)
	if err != nil || string(got) != string(data) {
		t.Fatalf("Get = %q, %v", got, err)
	}
	if l, err := s.List(); err != nil || len(l) != 1 || l[0] != d {
		t.Errorf("List = %v, %v", l, err)
	}
	if b, n, err := s.Usage(); err != nil || b != uint64(len(data)) || n < 1 {
		t.Errorf("Usage = %d bytes %d inodes %v", b, n, err)
	}
	if err := s.Delete(d); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(d); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Get after Delete: %v", err)
	}
	if err := s.Delete(d); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

func TestPutRejectsMismatchAndLeavesNothing(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("expected")
	if err := s.Put(d, []byte("tampered")); err == nil {
		t.Fatal("Put accepted data that does not match its digest")
	}
	if _, err := s.Get(d); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a rejected blob is readable: %v", err)
	}
	if err := s.Put("sha256:nothex", nil); err == nil {
		t.Error("Put accepted a malformed digest")
	}
	assertEmpty(t, filepath.Join(root, "ingest"))
}

func TestOpenDiscardsIngest(t *testing.T) {
	root := t.TempDir()
	if _, err := Open(root); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ingest", "partial"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(root); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, filepath.Join(root, "ingest"))
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("%s not empty: %v", dir, entries)
	}
}
