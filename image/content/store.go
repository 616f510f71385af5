// Package content keeps small image blobs (manifests, indexes, configs) by
// digest. A blob is written to a temp file, verified, synced and renamed into
// place, so a reader never sees a partial or unverified blob.
package content

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/opencontainers/go-digest"
)

// Store is a folder of blobs: blobs/<alg>/<hex>, with ingest/ for writes in
// progress and ingest/resumable/ for the downloads to resume (partial.go).
type Store struct {
	root string

	partialMu   sync.Mutex
	partialBusy map[digest.Digest]*partialHold // the download holding each partial file
}

// Open creates the folders and discards writes a crash left in ingest/,
// but for the partial downloads younger than PartialMaxAge.
func Open(root string) (*Store, error) {
	s := &Store{root: root, partialBusy: map[digest.Digest]*partialHold{}}
	for _, d := range []string{filepath.Join(root, "blobs", string(digest.SHA256)), s.ingest()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	left, err := os.ReadDir(s.ingest())
	if err != nil {
		return nil, err
	}
	for _, e := range left {
		if p := filepath.Join(s.ingest(), e.Name()); p != s.partialDir() || !e.IsDir() {
			if err := os.RemoveAll(p); err != nil {
				return nil, err
			}
		}
	}
	if err := s.RemoveStalePartials(PartialMaxAge); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) ingest() string { return filepath.Join(s.root, "ingest") }

func (s *Store) path(d digest.Digest) string {
	return filepath.Join(s.root, "blobs", string(d.Algorithm()), d.Encoded())
}

// Put stores data under d after checking that d is its digest.
func (s *Store) Put(d digest.Digest, data []byte) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("content: %w", err)
	}
	if got := d.Algorithm().FromBytes(data); got != d {
		return fmt.Errorf("content: digest mismatch: want %s, got %s", d, got)
	}
	if _, err := os.Stat(s.path(d)); err == nil {
		return nil
	}
	f, err := os.CreateTemp(s.ingest(), d.Encoded()+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.path(d))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("content: write %s: %w", d, err)
	}
	return nil
}

// Get returns the blob d, or an error wrapping fs.ErrNotExist.
func (s *Store) Get(d digest.Digest) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("content: %w", err)
	}
	return os.ReadFile(s.path(d))
}

// Delete removes the blob d; a missing blob is not an error.
func (s *Store) Delete(d digest.Digest) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("content: %w", err)
	}
	if err := os.Remove(s.path(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Usage counts the bytes and files the stored blobs and the downloads
// (ingest/, the partial ones to resume included) take. A partial download
// is counted by the blocks it has on the disk: its parts are written at
// their offsets, and the file may have holes.
func (s *Store) Usage() (bytes, inodes uint64, err error) {
	for _, dir := range []string{filepath.Join(s.root, "blobs"), s.ingest()} {
		b, n, err := usage(dir)
		if err != nil {
			return 0, 0, err
		}
		bytes, inodes = bytes+b, inodes+n
	}
	return bytes, inodes, nil
}

// usage counts the bytes (the smaller of size and blocks on the disk) and
// files under dir. A file removed during the walk is not counted.
func usage(dir string) (bytes, inodes uint64, err error) {
	err = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		inodes++
		if !e.Type().IsRegular() {
			return nil
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		size := uint64(info.Size())
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			size = min(size, uint64(st.Blocks)*512)
		}
		bytes += size
		return nil
	})
	return bytes, inodes, err
}

// List returns the digests of every stored blob.
func (s *Store) List() ([]digest.Digest, error) {
	var out []digest.Digest
	algs, err := os.ReadDir(filepath.Join(s.root, "blobs"))
	if err != nil {
		return nil, err
	}
	for _, alg := range algs {
		blobs, err := os.ReadDir(filepath.Join(s.root, "blobs", alg.Name()))
		if err != nil {
			return nil, err
		}
		for _, b := range blobs {
			out = append(out, digest.NewDigestFromEncoded(digest.Algorithm(alg.Name()), b.Name()))
		}
	}
	return out, nil
}
