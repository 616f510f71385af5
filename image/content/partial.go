package content

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
)

// PartialMaxAge is how long a partial download is kept after its last
// write: long enough for the kubelet's retries of a pull that a flaky
// network or a berthd restart cut, short enough that an image nobody asks
// for again does not hold its half-downloaded layers on the disk for long.
const PartialMaxAge = 24 * time.Hour

// A partial download of blob d is ingest/resumable/<alg>-<hex>, the bytes
// written at their offsets, and <alg>-<hex>.offset, the decimal length of
// the prefix known to be complete. The offset is written after the bytes
// it covers, so the prefix it names is on disk whenever berthd dies (a
// power cut may lose more: the digest check at the end catches that).
func (s *Store) partialDir() string { return filepath.Join(s.ingest(), "resumable") }

func (s *Store) partialPath(d digest.Digest) string {
	return filepath.Join(s.partialDir(), string(d.Algorithm())+"-"+d.Encoded())
}

const offsetSuffix = ".offset"

// Partial is the file a blob download writes into, kept across attempts
// (within a pull, across pulls and across berthd restarts) so that the
// next attempt asks only for the rest. One download of a digest uses it at
// a time.
type Partial struct {
	s      *Store
	d      digest.Digest
	f      *os.File
	size   int64 // of the blob: no byte is written past it
	offset int64
	hold   *partialHold
	unlock func()
}

// partialHold is a download holding a partial file: the others wait for
// done, and count what it writes as their progress.
type partialHold struct {
	done    chan struct{}
	written atomic.Int64
}

// followEvery is how often a wait on another's work (Follow) looks whether
// that work moved.
const followEvery = 100 * time.Millisecond

// OpenPartial opens (creating it if need be) the partial download of d, a
// blob of size bytes, waiting while another download of d holds it; each
// time that download wrote, the wait calls progressed (the waiter's
// progress watch: a holder that writes nothing stalls its waiters too).
// Offset says how much of it an earlier attempt completed.
func (s *Store) OpenPartial(ctx context.Context, d digest.Digest, size int64, progressed func()) (*Partial, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("content: %w", err)
	}
	hold, unlock, err := s.lockPartial(ctx, d, progressed)
	if err != nil {
		return nil, err
	}
	p, err := s.openPartialLocked(d, size)
	if err != nil {
		unlock()
		return nil, err
	}
	p.hold, p.unlock = hold, unlock
	return p, nil
}

func (s *Store) openPartialLocked(d digest.Digest, size int64) (*Partial, error) {
	if err := os.MkdirAll(s.partialDir(), 0o700); err != nil {
		return nil, err
	}
	path := s.partialPath(d)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	// A missing or torn offset file means nothing is known complete.
	saved, _ := readOffset(path + offsetSuffix)
	return &Partial{s: s, d: d, f: f, size: size, offset: min(saved, fi.Size(), size)}, nil
}

func readOffset(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("offset file %s: %q", path, b)
	}
	return n, nil
}

// lockPartial makes the caller the one download of d, waiting for the
// current one to finish, and calling progressed whenever it wrote.
func (s *Store) lockPartial(ctx context.Context, d digest.Digest, progressed func()) (*partialHold, func(), error) {
	for {
		hold, unlock, busy := s.tryLockPartial(d)
		if busy == nil {
			return hold, unlock, nil
		}
		if err := Follow(ctx, busy.done, &busy.written, progressed); err != nil {
			return nil, nil, err
		}
	}
}

// tryLockPartial makes the caller the one user of d's partial file, or
// returns the download that holds it (busy).
func (s *Store) tryLockPartial(d digest.Digest) (hold *partialHold, unlock func(), busy *partialHold) {
	s.partialMu.Lock()
	defer s.partialMu.Unlock()
	if busy, ok := s.partialBusy[d]; ok {
		return nil, nil, busy
	}
	hold = &partialHold{done: make(chan struct{})}
	s.partialBusy[d] = hold
	return hold, func() {
		s.partialMu.Lock()
		delete(s.partialBusy, d)
		s.partialMu.Unlock()
		close(hold.done)
	}, nil
}

// Follow waits until done is closed, or returns ctx's cause; every
// followEvery it calls progressed if moved (the bytes another party's work
// moved) changed since it last looked. A pull waiting on another's work
// (its partial file here, its unpack in the image package) counts that
// work's bytes as its own progress, and nothing else.
func Follow(ctx context.Context, done <-chan struct{}, moved *atomic.Int64, progressed func()) error {
	tick := time.NewTicker(followEvery)
	defer tick.Stop()
	seen := moved.Load()
	for {
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
			if n := moved.Load(); n != seen {
				seen = n
				progressed()
			}
		}
	}
}

// Offset is the length of the prefix an earlier attempt completed.
func (p *Partial) Offset() int64 { return p.offset }

// ErrPastSize is returned (wrapped) for a write past the blob's size.
var ErrPastSize = errors.New("write past the blob's size")

// WriteAt writes downloaded bytes at their offset in the blob; none goes
// past the size the file was opened with, which bounds the file.
func (p *Partial) WriteAt(b []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(b)) > p.size {
		return 0, fmt.Errorf("blob %s: %w: %d bytes at %d of %d", p.d, ErrPastSize, len(b), off, p.size)
	}
	n, err := p.f.WriteAt(b, off)
	p.hold.written.Add(int64(n))
	return n, err
}

// ReadAt reads bytes of the blob written earlier.
func (p *Partial) ReadAt(b []byte, off int64) (int, error) { return p.f.ReadAt(b, off) }

// Checkpoint records that the first n bytes are complete.
func (p *Partial) Checkpoint(n int64) error {
	p.offset = n
	return os.WriteFile(p.f.Name()+offsetSuffix, []byte(strconv.FormatInt(n, 10)), 0o600)
}

// Close keeps the file for the next attempt, up to its last checkpoint.
func (p *Partial) Close() error {
	err := p.f.Close()
	p.unlock()
	return err
}

// Remove deletes the file: the blob is complete, or its bytes failed the
// digest check and must not be resumed from.
func (p *Partial) Remove() error {
	p.f.Close()
	err := errors.Join(removeIfExists(p.f.Name()), removeIfExists(p.f.Name()+offsetSuffix))
	p.unlock()
	return err
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// RemoveStalePartials deletes the partial downloads that no download holds
// and that nothing wrote to for longer than maxAge (0: every one no
// download holds). A download that asks for a file while it is being
// removed waits, and then starts it over.
func (s *Store) RemoveStalePartials(maxAge time.Duration) error {
	entries, err := os.ReadDir(s.partialDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		data := strings.TrimSuffix(e.Name(), offsetSuffix)
		alg, hex, ok := strings.Cut(data, "-")
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) <= maxAge {
			continue
		}
		_, unlock, busy := s.tryLockPartial(digest.NewDigestFromEncoded(digest.Algorithm(alg), hex))
		if busy != nil {
			continue
		}
		errs = append(errs, removeIfExists(filepath.Join(s.partialDir(), e.Name())))
		unlock()
	}
	return errors.Join(errs...)
}
