// Package crilog writes container output in the CRI log format the kubelet
// reads: one record per line,
//
//	<RFC3339Nano time> <stdout|stderr> <F|P> <content>\n
//
// where a line longer than MaxRecord is split into P (partial) records
// and the record that ends a line is F.
package crilog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// MaxRecord is the most content one record carries; longer lines are split.
const MaxRecord = 16 << 10

// Stream names.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// readSize is the copy buffer per stream, held for the container's life
// (two per container): a record's worth keeps reads few and memory small.
const readSize = MaxRecord

// Writer appends records to one log file. Records from concurrent streams
// interleave whole; a record is written with a single write(2).
type Writer struct {
	mu     sync.Mutex
	dir    string   // the log is opened beneath it
	rel    string   // the log's path below dir; "": discard
	f      *os.File // nil: discard (no path, or closed)
	closed bool
	now    func() time.Time
}

// Open opens (appending, creating 0640) the log at path, which must lie
// beneath the folder dir ("": path's own folder); path "" discards.
// Whoever can write under dir (a log agent, a container given the folder as
// a volume) must not make the shim, root, write elsewhere nor hang it:
// path's components below dir may not be symlinks, and the log must be a
// regular file (not a FIFO, which would block the open or the writes, nor a
// device or a folder).
func Open(path, dir string) (*Writer, error) {
	w := &Writer{now: time.Now}
	if path == "" {
		return w, nil
	}
	if dir == "" {
		dir = filepath.Dir(path)
	}
	rel, err := filepath.Rel(dir, path)
	if err != nil || !filepath.IsLocal(rel) {
		return nil, fmt.Errorf("container log %s: not beneath the log folder %s", path, dir)
	}
	w.dir, w.rel = dir, rel
	if w.f, err = w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

// logOpenFlags: O_NONBLOCK so that opening a FIFO fails (ENXIO, no
// reader) or returns at once, rather than waiting for a reader; cleared
// again once the file is known to be regular.
const logOpenFlags = unix.O_WRONLY | unix.O_CREAT | unix.O_APPEND | unix.O_NOFOLLOW |
	unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC

// open opens the log with openat2 beneath dir: the kernel refuses a
// symlink in any component (and .., magic links) in the same call that
// opens the file, with no race against renames. A kernel without openat2
// (before Linux 5.6) fails the open, naming what is missing, rather than
// opening the log less safely.
func (w *Writer) open() (*os.File, error) {
	path := filepath.Join(w.dir, w.rel)
	dirfd, err := unix.Open(w.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("container log %s: open its folder %s: %w", path, w.dir, err)
	}
	defer unix.Close(dirfd)
	how := &unix.OpenHow{Flags: logOpenFlags, Mode: 0o640,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(dirfd, w.rel, how)
	for err == unix.EINTR || err == unix.EAGAIN {
		fd, err = unix.Openat2(dirfd, w.rel, how)
	}
	switch {
	case err == unix.ENOSYS:
		return nil, fmt.Errorf("container log %s: the kernel has no openat2 (Linux 5.6 and later have it), which the shim needs to open logs safely", path)
	case err == unix.ELOOP:
		return nil, fmt.Errorf("container log %s: a symlink in its path below %s is refused", path, w.dir)
	case err == unix.ENXIO:
		return nil, fmt.Errorf("container log %s: not a regular file (a FIFO or socket)", path)
	case err != nil:
		return nil, fmt.Errorf("container log %s: %w", path, err)
	}
	if err := checkRegular(fd); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("container log %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkRegular refuses anything but a regular file (a FIFO that some
// process reads, a device) and makes writes to it blocking again.
func checkRegular(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG {
		return fmt.Errorf("not a regular file but a %s", fileTypes[t])
	}
	return unix.SetNonblock(fd, false)
}

// fileTypes names what a log path may be instead of a regular file.
var fileTypes = map[uint32]string{unix.S_IFIFO: "FIFO", unix.S_IFSOCK: "socket", unix.S_IFCHR: "character device",
	unix.S_IFBLK: "block device", unix.S_IFDIR: "folder", unix.S_IFLNK: "symlink"}

// Reopen opens the path again: after log rotation renamed the file,
// records go to a fresh file at the original path.
func (w *Writer) Reopen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("log closed")
	}
	if w.rel == "" {
		return nil
	}
	f, err := w.open()
	if err != nil {
		return err
	}
	if w.f != nil {
		w.f.Close()
	}
	w.f = f
	return nil
}

// Close closes the file; later records are dropped.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// record writes one record. Write errors are dropped: a full disk must not
// block the container (its pipe would fill and stall it).
func (w *Writer) record(buf []byte, stream string, partial bool, content []byte) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return buf
	}
	tag := " F "
	if partial {
		tag = " P "
	}
	buf = w.now().UTC().AppendFormat(buf[:0], time.RFC3339Nano)
	buf = append(buf, ' ')
	buf = append(buf, stream...)
	buf = append(buf, tag...)
	buf = append(buf, content...)
	buf = append(buf, '\n')
	w.f.Write(buf)
	return buf
}

// Copy reads r until EOF (or any error, such as EIO from a pty whose
// other side closed) and writes its lines as records of stream. An
// unterminated last line is written as P records, as containerd and CRI-O
// write it: no newline was written, so none is added; the kubelet reads a
// termination message from the log (FallbackToLogsOnError) byte for byte.
func (w *Writer) Copy(stream string, r io.Reader) {
	var (
		rd      = make([]byte, readSize)
		pending []byte // bytes of the current line not yet written
		rec     []byte // scratch for formatting records
	)
	for {
		n, err := r.Read(rd)
		data := rd[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				pending = append(pending, data...)
				break
			}
			pending = append(pending, data[:i]...)
			data = data[i+1:]
			rec = w.emit(rec, stream, pending)
			pending = pending[:0]
		}
		// Cut only when more than a record is pending: a line of exactly
		// MaxRecord bytes then ends in one F record, not P plus empty F.
		for len(pending) > MaxRecord {
			rec = w.record(rec, stream, true, pending[:MaxRecord])
			pending = append(pending[:0], pending[MaxRecord:]...)
		}
		if err != nil {
			if len(pending) > 0 {
				w.record(rec, stream, true, pending)
			}
			return
		}
	}
}

// emit writes a complete line: P records of MaxRecord, then the F record.
func (w *Writer) emit(rec []byte, stream string, line []byte) []byte {
	for len(line) > MaxRecord {
		rec = w.record(rec, stream, true, line[:MaxRecord])
		line = line[MaxRecord:]
	}
	return w.record(rec, stream, false, line)
}
