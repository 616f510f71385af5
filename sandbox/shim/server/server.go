// Package server is the berth-shim process: one per pod, the child
// subreaper of the pod's containers, whose output it writes to CRI log
// files, whose exits it records durably, and whose stdio it serves to
// attach and exec streams. It serves the API of package shim
// (shim.ServeConn). It never runs libcontainer itself: creating a
// container, changing limits and deleting are each done by
// berth-shim-helper (package ops), an op process per operation, so that
// what libcontainer leaves resident is not paid once per pod. An exec is
// started by berth-exec-init, a small C program, with the container's
// settings that the op process saved at create (execinit.go): no Go
// program starts per exec. A container without them execs through
// berth-shim-helper: ExecSync through the exec server, kept while execs
// come close together; a streaming exec through an op process.
package server

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cri/atomicfile"
	"github.com/berth-runtime/berth/cri/detach"
	"github.com/berth-runtime/berth/sandbox/shim"
)

// Server is the state of one shim.
type Server struct {
	dir       string
	lcRoot    string
	helperBin string    // berth-shim-helper
	execInit  *execInit // nil: execs go through berth-shim-helper
	reaper    *reaper

	mu       sync.Mutex
	ctrs     map[string]*ctr
	creating map[string]bool
	events   *eventLog
	execs    map[string]chan struct{} // by token: closed when the caller has gone
	quit     chan struct{}
	quitOnce sync.Once

	trimMu sync.Mutex
	trim   *time.Timer // pending trimSoon, nil when none

	execSrvMu sync.Mutex
	execSrv   *execServer // the one serving ExecSync, nil when none
}

// Run serves the pod folder dir until Shutdown (or SIGTERM/SIGINT while no
// container is live). ready, if not nil, is told (detach.Ready) once the
// socket listens.
func Run(dir string, ready *os.File) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	// Orphans below the shim (a container's init or an exec'd process once
	// the op process that started it exits, runc init's intermediate stages)
	// are reparented to it, not to pid 1.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set child subreaper: %w", err)
	}
	helperBin, err := helperBinary()
	if err != nil {
		return err
	}
	execInit, err := openExecInit()
	if err != nil {
		return err
	}
	s := &Server{
		execInit:  execInit,
		dir:       dir,
		helperBin: helperBin,
		lcRoot:    filepath.Join(dir, shim.StateRoot),
		reaper:    newReaper(),
		ctrs:      map[string]*ctr{},
		creating:  map[string]bool{},
		events:    newEventLog(),
		execs:     map[string]chan struct{}{},
		quit:      make(chan struct{}),
	}
	// The bundles below Containers must be reachable by a container's init
	// in a user namespace (see berthd's state folder); libcontainer's state
	// need not.
	if err := os.MkdirAll(s.lcRoot, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, shim.Containers), 0o711); err != nil {
		return err
	}
	if c, err := shim.Dial(dir); err == nil {
		c.Close()
		return errors.New("another shim serves " + dir)
	}
	go s.reaper.run()

	l, err := shim.Listen(dir)
	if err != nil {
		return err
	}
	defer os.Remove(shim.SocketPath(dir))
	sl, err := shim.ListenStream(dir)
	if err != nil {
		l.Close()
		return err
	}
	defer os.Remove(shim.StreamPath(dir))
	pidFile := filepath.Join(dir, shim.PidFile)
	if err := atomicfile.Write(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		l.Close()
		sl.Close()
		return err
	}
	defer os.Remove(pidFile)

	methods := (&API{s: s}).methods()
	go s.signals()
	go s.accept(l, methods)
	go s.acceptStreams(sl)
	detach.Ready(ready)
	log.Printf("serving %s (pid %d)", dir, os.Getpid())
	<-s.quit
	l.Close()
	sl.Close()
	s.stopExecServer()
	log.Printf("shutting down")
	return nil
}

func (s *Server) accept(l net.Listener, methods map[string]shim.Method) {
	for {
		conn, err := l.Accept()
		if err != nil {
			select {
			case <-s.quit:
				return
			default:
			}
			log.Printf("accept: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go shim.ServeConn(conn, methods)
	}
}

// signals: SIGTERM/SIGINT stop an idle shim; a shim with live containers
// stays (killing it would orphan them), Shutdown is the way to end it.
func (s *Server) signals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGTERM, unix.SIGINT)
	for sig := range ch {
		if err := s.shutdown(); err != nil {
			log.Printf("%v: ignored: %v", sig, err)
		}
	}
}

// live counts containers with a process (created or running).
func (s *Server) live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.creating)
	for _, c := range s.ctrs {
		if c.state.Status != shim.StatusStopped {
			n++
		}
	}
	return n
}

// trimSoon gives the memory freed since the last collection back to the
// system a second from now, once however many ask meanwhile: a shim idles
// for the pod's lifetime, and should hold what it keeps, not what a start
// or a big exec needed at its peak (the scavenger alone returns it slowly).
func (s *Server) trimSoon() {
	s.trimMu.Lock()
	defer s.trimMu.Unlock()
	if s.trim != nil {
		return
	}
	s.trim = time.AfterFunc(time.Second, func() {
		s.trimMu.Lock()
		s.trim = nil
		s.trimMu.Unlock()
		debug.FreeOSMemory()
	})
}

// shutdown ends Run at once. The Shutdown call's reply races the exit and
// may never go out: the client takes the shim hanging up as success
// (shim.Client.Shutdown), and berthd waits for the process to be gone, so
// the pod's teardown waits for nothing else.
func (s *Server) shutdown() error {
	if n := s.live(); n > 0 {
		return fmt.Errorf("%w: %d", shim.ErrBusy, n)
	}
	s.quitOnce.Do(func() { close(s.quit) })
	return nil
}
