// Package daemonlog is the own log of a process berthd starts detached
// (its own session) that outlives berthd, the lazy layer server: a file,
// since nothing then reads its stderr (journald has berthd's), bounded on
// a node that runs for months. At maxBytes the file is renamed to
// PATH.1, the one before it dropped, and a new one starts: the process's
// last lines stay whole, and the two files together never take much more
// than twice maxBytes. The process's stdout and stderr follow the current
// file, so that what does not go through the writer (a panic's trace, the
// Go runtime's own messages) lands there too.
package daemonlog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Stdio are the descriptors Open points at the log: stdout and stderr.
var Stdio = []int{1, 2}

// Log is the log file, a writer for a logger.
type Log struct {
	path     string
	maxBytes int64
	stdio    []int

	mu   sync.Mutex
	f    *os.File
	size int64 // of f, written through Log or not when it was opened
}

// Open appends to the file at path (made 0600 if missing) and points the
// descriptors stdio at it; writes rotate it once they would take it past
// maxBytes.
func Open(path string, maxBytes int64, stdio []int) (*Log, error) {
	l := &Log{path: path, maxBytes: maxBytes, stdio: stdio}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

// open makes the file at path the current one, stdio included.
func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	for _, fd := range l.stdio {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			f.Close()
			return fmt.Errorf("point descriptor %d at %s: %w", fd, l.path, err)
		}
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.size = f, fi.Size()
	return nil
}

// Write appends p, rotating the file first if p would take it past
// maxBytes. A rotation that fails is said in the current file, which
// takes p, and is tried again after another maxBytes.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size > 0 && l.size+int64(len(p)) > l.maxBytes {
		if err := l.rotate(); err != nil {
			fmt.Fprintf(l.f, "log rotation of %s failed, writing on: %v\n", l.path, err)
			l.size = 0
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// rotate renames the current file to path.1, replacing the one there,
// and starts a new one. A file already gone from path (renamed by a
// rotation whose open failed, or removed by hand) is started anew: else
// every later rotation would fail on it and the file written grow on.
func (l *Log) rotate() error {
	if err := os.Rename(l.path, l.path+".1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return l.open()
}
