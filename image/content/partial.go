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
// a time. A download from another source than the one holding it gets a
// private file instead (Private), which goes when it closes.
type Partial struct {
	s      *Store
	d      digest.Digest
	f      *os.File
	size   int64 // of the blob: no byte is written past it
	offset int64
	unlock func()
	// private is a file of this download alone, in ingest/ (which Open
	// empties): never resumed, removed however the download ends.
	private bool
}

// Downloader is who asks for a blob's partial file.
type Downloader struct {
	// Source is where it downloads from: the registry endpoint it fetches
	// from (a mirror's host, not the image's registry) and the repository.
	// Downloads from one source share the partial file, one after the
	// other; one from another source never waits for it: a registry that
	// serves a popular blob slowly must not hold every pull of it.
	Source string
	// Clock is its pull's progress clock (unix nanoseconds): moved by its
	// bytes and by the waits its pull excuses (for a download slot). The
	// downloads of its source waiting for the file count it as theirs.
	Clock *atomic.Int64
	// Progressed is called, while it waits for the file, each time the
	// holder's clock moved (the waiter's progress watch: a holder that
	// stalls stalls its waiters too).
	Progressed func()
}

// partialHold is a download holding a partial file: the others of its
// source wait for done, and follow its clock.
type partialHold struct {
	done   chan struct{}
	source string
	clock  *atomic.Int64
}

// followEvery is how often a wait on another's work (Follow) looks whether
// that work moved.
const followEvery = 100 * time.Millisecond

// OpenPartial opens (creating it if need be) the partial download of d, a
// blob of size bytes, for by: waiting while another download from by's
// source holds it, or opening a private file while one from another source
// does. Offset says how much of it an earlier attempt completed.
func (s *Store) OpenPartial(ctx context.Context, d digest.Digest, size int64, by Downloader) (*Partial, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("content: %w", err)
	}
	unlock, private, err := s.lockPartial(ctx, d, by)
	if err != nil {
		return nil, err
	}
	if private {
		return s.openPrivate(d, size)
	}
	p, err := s.openPartialLocked(d, size)
	if err != nil {
		unlock()
		return nil, err
	}
	p.unlock = unlock
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

// openPrivate makes a download's own file for d, beside the blobs being
// written (ingest/, which Open empties: a berthd killed during the
// download leaves nothing behind either).
func (s *Store) openPrivate(d digest.Digest, size int64) (*Partial, error) {
	f, err := os.CreateTemp(s.ingest(), "private-"+d.Encoded()+"-")
	if err != nil {
		return nil, err
	}
	return &Partial{s: s, d: d, f: f, size: size, unlock: func() {}, private: true}, nil
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

// lockPartial makes by the one download of d's partial file, waiting for
// the current one from its source to finish (following its clock), or
// says that by downloads into a private file: the holder's source is
// another.
func (s *Store) lockPartial(ctx context.Context, d digest.Digest, by Downloader) (unlock func(), private bool, err error) {
	for {
		unlock, busy := s.tryLockPartial(d, by)
		switch {
		case busy == nil:
			return unlock, false, nil
		case busy.source != by.Source && busy.source != removal.Source:
			return nil, true, nil
		}
		if err := Follow(ctx, busy.done, busy.clock, by.Progressed); err != nil {
			return nil, false, err
		}
	}
}

// tryLockPartial makes by the one user of d's partial file, or returns the
// download that holds it (busy).
func (s *Store) tryLockPartial(d digest.Digest, by Downloader) (unlock func(), busy *partialHold) {
	s.partialMu.Lock()
	defer s.partialMu.Unlock()
	if busy, ok := s.partialBusy[d]; ok {
		return nil, busy
	}
	hold := &partialHold{done: make(chan struct{}), source: by.Source, clock: by.Clock}
	s.partialBusy[d] = hold
	return func() {
		s.partialMu.Lock()
		delete(s.partialBusy, d)
		s.partialMu.Unlock()
		close(hold.done)
	}, nil
}

// Follow waits until done is closed, or returns ctx's cause; every
// followEvery it calls progressed if moved (the progress clock of another
// party's work) changed since it last looked. A pull waiting on another's
// work (its partial file here, its unpack in the image package) counts
// that work's progress as its own, and nothing else.
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
	return p.f.WriteAt(b, off)
}

// ReadAt reads bytes of the blob written earlier.
func (p *Partial) ReadAt(b []byte, off int64) (int, error) { return p.f.ReadAt(b, off) }

// Checkpoint records that the first n bytes are complete; a private file
// is never resumed, and records nothing.
func (p *Partial) Checkpoint(n int64) error {
	p.offset = n
	if p.private {
		return nil
	}
	return os.WriteFile(p.f.Name()+offsetSuffix, []byte(strconv.FormatInt(n, 10)), 0o600)
}

// Close keeps the file for the next attempt, up to its last checkpoint;
// a private file goes.
func (p *Partial) Close() error {
	if p.private {
		return p.Remove()
	}
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
		errs = append(errs, s.removeIdlePartial(digest.NewDigestFromEncoded(digest.Algorithm(alg), hex), e.Name()))
	}
	return errors.Join(errs...)
}

// DropPartial deletes d's partial download unless a download holds it:
// the blob's layer is on the disk, and the bytes of a pull that gave up
// on it (cancelled, or another source's that stalled) would wait for
// nothing but PartialMaxAge.
func (s *Store) DropPartial(d digest.Digest) error {
	name := filepath.Base(s.partialPath(d))
	return errors.Join(s.removeIdlePartial(d, name), s.removeIdlePartial(d, name+offsetSuffix))
}

// removal holds a partial file while the clean-up removes it: a download
// of any source waits for it (briefly), and then starts the file over.
var removal = Downloader{Clock: new(atomic.Int64)}

// removeIdlePartial removes file name (d's data or its offset) from the
// partial downloads, unless a download holds d.
func (s *Store) removeIdlePartial(d digest.Digest, name string) error {
	unlock, busy := s.tryLockPartial(d, removal)
	if busy != nil {
		return nil
	}
	defer unlock()
	return removeIfExists(filepath.Join(s.partialDir(), name))
}
