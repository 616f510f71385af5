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
	"io"
	"os"
	"sync"
	"syscall"
	"time"
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
	path   string
	f      *os.File // nil: discard (no path, or closed)
	closed bool
	now    func() time.Time
}

// Open opens (appending, creating 0640) the log at path; "" discards.
func Open(path string) (*Writer, error) {
	w := &Writer{path: path, now: time.Now}
	if path == "" {
		return w, nil
	}
	f, err := openLog(path)
	if err != nil {
		return nil, err
	}
	w.f = f
	return w, nil
}

func openLog(path string) (*os.File, error) {
	// O_NOFOLLOW: whoever can write the log folder must not redirect the
	// shim's (root's) writes to another file with a symlink.
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o640)
}

// Reopen opens the path again: after log rotation renamed the file,
// records go to a fresh file at the original path.
func (w *Writer) Reopen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("log closed")
	}
	if w.path == "" {
		return nil
	}
	f, err := openLog(w.path)
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
// unterminated last line is written as F.
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
				w.emit(rec, stream, pending)
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
