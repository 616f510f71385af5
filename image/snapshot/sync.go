package snapshot

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A commit records its snapshot at once, marked with the boot it was
// unpacked in, and the flusher makes it durable after the fact: one syncfs
// of the store's filesystem once commits have been quiet for flushQuiet (at
// most flushMax after the first one waiting), then one transaction that
// clears the marks of the snapshots it covered. A pull thus never waits for
// the disk, and its writeback does not compete with its own unpacks. What a
// crash leaves marked is settled by Open: in the same boot the files are in
// the page cache and one syncfs makes them durable; after a reboot they may
// be torn, and the snapshot is dropped (its images are pulled again).
const (
	flushQuiet = time.Second
	flushMax   = 5 * time.Second
)

type flusher struct {
	syncfs     func() error
	markSynced func(pending map[string]string) error // snapshot name → chain ID
	log        *slog.Logger
	quiet, max time.Duration

	mu      sync.Mutex
	pending map[string]string // committed, not yet covered by a flush that started after

	kick     chan struct{} // a commit is waiting
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func newFlusher(syncfs func() error, markSynced func(map[string]string) error, log *slog.Logger) *flusher {
	return &flusher{
		syncfs: syncfs, markSynced: markSynced, log: log, quiet: flushQuiet, max: flushMax,
		pending: map[string]string{},
		kick:    make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// add queues the committed snapshot name (of chainID) for the next flush.
func (f *flusher) add(name, chainID string) {
	f.mu.Lock()
	f.pending[name] = chainID
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// run flushes until close: after the first commit it waits for a quiet
// spell, or max, then flushes what was committed until the flush started.
func (f *flusher) run() {
	defer close(f.done)
	for {
		select {
		case <-f.kick:
		case <-f.stop:
			f.flush()
			return
		}
		stopped := f.waitQuiet()
		f.flush()
		if stopped {
			return
		}
	}
}

// waitQuiet returns when no commit came for f.quiet, f.max after it was
// called, or at close (true).
func (f *flusher) waitQuiet() (stopped bool) {
	most := time.NewTimer(f.max)
	defer most.Stop()
	quiet := time.NewTimer(f.quiet)
	defer quiet.Stop()
	for {
		select {
		case <-f.kick:
			quiet.Reset(f.quiet)
		case <-quiet.C:
			return false
		case <-most.C:
			return false
		case <-f.stop:
			return true
		}
	}
}

// flush syncs the filesystem, then records the snapshots pending before it
// started as synced. On failure they stay pending, for the next flush or
// the next Open.
func (f *flusher) flush() {
	f.mu.Lock()
	batch := f.pending
	f.pending = map[string]string{}
	f.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	err := f.syncfs()
	if err == nil {
		err = f.markSynced(batch)
	}
	if err != nil {
		f.log.Error("make unpacked layers durable; retried with the next commit, or at berthd's next start", "layers", len(batch), "err", err)
		f.mu.Lock()
		for name, chainID := range batch {
			if _, newer := f.pending[name]; !newer {
				f.pending[name] = chainID
			}
		}
		f.mu.Unlock()
	}
}

// close flushes what is pending and stops the flusher; later calls wait
// for the first.
func (f *flusher) close() {
	f.stopOnce.Do(func() { close(f.stop) })
	<-f.done
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

// bootID names this boot of the machine: page-cache data that was not
// synced survives a berthd restart within one boot, not a reboot.
func bootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
