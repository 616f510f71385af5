package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// wantsTTY reports whether the container gets a pty: asked for, or set in
// its spec. Only that field is decoded: the shim never builds encoding/json's
// tables of the whole OCI spec (berth-shim-helper reads the spec).
func wantsTTY(bundle string, asked bool) (bool, error) {
	b, err := os.ReadFile(filepath.Join(bundle, shim.ConfigFile))
	if err != nil {
		return false, err
	}
	var spec struct {
		Process *struct {
			Terminal bool `json:"terminal"`
		} `json:"process"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return false, fmt.Errorf("config.json: %w", err)
	}
	if spec.Process == nil {
		return false, errors.New("config.json: no process")
	}
	return asked || spec.Process.Terminal, nil
}

// execFifo lets a created container's init exec its process, as
// libcontainer's Container.Exec does: open the init's exec fifo for reading
// (the init waits in its open for writing), read what the init writes until
// it execs (the fifo is close-on-exec), and remove the fifo, which tells
// libcontainer's state the container is running. An init that dies first
// fails it.
func (s *Server) execFifo(c *ctr) error {
	path := filepath.Join(s.lcRoot, c.id, shim.ExecFifo)
	ch := make(chan fifoOpen, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
		ch <- fifoOpen{f, err}
	}()
	var o fifoOpen
	select {
	case o = <-ch:
	case <-c.exited:
		unblockFifo(path, ch)
		return errors.New("container process is already dead")
	}
	if o.err != nil {
		return fmt.Errorf("exec fifo: %w", o.err)
	}
	defer o.f.Close()
	data, err := io.ReadAll(o.f)
	if err != nil {
		return fmt.Errorf("exec fifo: %w", err)
	}
	if len(data) == 0 {
		return errors.New("cannot start an already running container")
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// fifoOpen is the outcome of a blocking open of the exec fifo.
type fifoOpen struct {
	f   *os.File
	err error
}

// unblockFifo ends the open of the fifo that waits for a writer that died:
// a writer that does not wait (O_NONBLOCK) succeeds once a reader is in
// open, and fails (ENXIO) until then, so it is tried until the open ends.
func unblockFifo(path string, opened <-chan fifoOpen) {
	go func() {
		for {
			if w, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
				w.Close()
			} else if errors.Is(err, os.ErrNotExist) {
				return
			}
			select {
			case o := <-opened:
				if o.f != nil {
					o.f.Close()
				}
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
}
