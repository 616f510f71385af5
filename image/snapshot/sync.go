package snapshot

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// fsSyncer shares syncfs calls between the commits that wait for one: a
// pull commits up to four layers at a time, and each must find its files on
// disk before its record is written. A commit waits for a syncfs that
// started after it asked (one already running may have missed its files),
// so commits that ask while one runs share the next one, instead of
// flushing the filesystem (and the journal, and the disk's cache) once
// each, one after the other.
type fsSyncer struct {
	root   string                 // a folder of the filesystem to sync
	syncfs func(dir string) error // syncFS, but in tests

	mu      sync.Mutex
	cond    *sync.Cond
	started uint64           // syncs started
	done    uint64           // syncs finished (they run one at a time)
	running bool             // a sync runs now
	failed  map[uint64]error // the syncs that failed, until their waiters saw it
	waiting map[uint64]int   // waiters per sync they wait for
}

func newFSSyncer(root string) *fsSyncer {
	s := &fsSyncer{root: root, syncfs: syncFS, failed: map[uint64]error{}, waiting: map[uint64]int{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// sync returns once a syncfs that started after the call has finished,
// with that syncfs's error.
func (s *fsSyncer) sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := s.started + 1 // the first sync to start from now on
	s.waiting[want]++
	for s.done < want {
		if s.running {
			s.cond.Wait()
			continue
		}
		s.running = true
		s.started++
		gen := s.started
		s.mu.Unlock()
		err := s.syncfs(s.root)
		s.mu.Lock()
		s.running, s.done = false, gen
		if err != nil {
			s.failed[gen] = err
		}
		s.cond.Broadcast()
	}
	err := s.failed[want]
	if s.waiting[want]--; s.waiting[want] == 0 {
		delete(s.waiting, want)
		delete(s.failed, want)
	}
	return err
}

// syncFS flushes the filesystem holding dir once, instead of one fsync per
// unpacked file.
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return errors.Join(errors.New("syncfs "+dir), err)
	}
	return nil
}
