package lazyd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/lazy"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/opencontainers/go-digest"
)

// waitBound bounds a Status call that waits for an event, so that a
// client whose server went away learns it.
const waitBound = 30 * time.Second

// completeRetry is the pause before a background fetch that ended with
// chunks missing (a registry away) starts again: without it the layer
// would depend on the registry until the next berthd asked (restoreLazy).
var completeRetry = time.Minute

// servedVersion is the ProtocolVersion the server's Status gives; only a
// tests' build (version_crashpoints.go) sets another, to play a server an
// older berthd left.
var servedVersion = ProtocolVersion

// ServeOptions configure the server.
type ServeOptions struct {
	Dir        string        // the folder of its socket and pid file
	Fetches    int           // background requests of all layers together at a time
	FetchQuiet time.Duration // their hold after on-demand fetches (lazy.Fetches)
	Inflate    func(io.Reader) (io.ReadCloser, error)
	Log        *slog.Logger
}

// Server serves lazy layers.
type Server struct {
	opts    ServeOptions
	fetches *lazy.Fetches
	ln      net.Listener
	closed  chan struct{}

	mu         sync.Mutex
	layers     map[string]*lazy.Layer
	fsDirs     map[string]string        // where each layer is mounted
	completing map[string]bool          // layers whose background fetch was started
	mounting   map[string]chan struct{} // mounts under way, closed when each ends
	broken     map[string]string
	demands    map[string]*demandLease // the pulls' prioritised fetches under way, by ID
	// mountWaits, in tests, is told of each wait for a mount under way.
	mountWaits func(key string)
	events     uint64
	changed    chan struct{} // closed and replaced at every event

	readFailures, verificationFailures atomic.Uint64
}

// Serve serves lazy layers on the socket in opts.Dir until asked to exit
// (Exit) with no layer left. ready is called once the socket listens.
func Serve(opts ServeOptions, ready func()) error {
	if err := rootOnlyDir(opts.Dir); err != nil {
		return err
	}
	sock := filepath.Join(opts.Dir, SocketFile)
	os.Remove(sock) // a dead server's; a live one answered the caller's Dial
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	// Its Close unlinks the socket, at once: exit closes it before its
	// answer lets berthd start a successor, whose socket and pid file a
	// removal deferred to Serve's return could take.
	defer ln.Close()
	if err := os.WriteFile(filepath.Join(opts.Dir, PIDFile), fmt.Appendf(nil, "%d\n", os.Getpid()), 0o600); err != nil {
		return err
	}
	s := &Server{opts: opts, fetches: lazy.NewFetches(opts.Fetches, opts.FetchQuiet), ln: ln, closed: make(chan struct{}),
		layers: map[string]*lazy.Layer{}, fsDirs: map[string]string{}, completing: map[string]bool{}, mounting: map[string]chan struct{}{}, broken: map[string]string{}, demands: map[string]*demandLease{}, changed: make(chan struct{})}
	srv := rpc.NewServer()
	if err := srv.RegisterName(service, &api{s}); err != nil {
		s.removePIDFile()
		return err
	}
	ready()
	for {
		conn, err := ln.Accept()
		if err != nil {
			select {
			case <-s.closed:
				return nil
			default:
				s.removePIDFile()
				return err
			}
		}
		go srv.ServeConn(conn)
	}
}

// rootOnlyDir makes dir, the folder of the socket, and makes it 0700
// whatever mode it had: the socket's only protection, since whoever
// reaches it has root mount any registry's layer anywhere.
func rootOnlyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

func (s *Server) removePIDFile() {
	os.Remove(filepath.Join(s.opts.Dir, PIDFile))
}

// source opens the registry source of a layer at its first request, so
// that a registry away when the layer is handed over (a restart) fails
// only the reads that need it.
type source struct {
	spec registry.BlobSource
	mu   sync.Mutex
	b    *registry.Blobs
}

func (s *source) Get(ctx context.Context, d string, size int64, want registry.Span, ranged bool) (*registry.BlobBody, error) {
	s.mu.Lock()
	if s.b == nil {
		b, err := s.spec.Open(ctx)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.b = b
	}
	b := s.b
	s.mu.Unlock()
	return b.Get(ctx, d, size, want, ranged)
}

// mount serves a prepared layer, once: a mount of a key under way or done
// is not done again. berthd's Mount may give up waiting before it ends
// (ErrNoAnswer), and its Unmount of the key then waits for it (unmount).
func (s *Server) mount(a MountArgs) error {
	s.mu.Lock()
	s.waitMountingLocked(a.Key)
	if _, ok := s.layers[a.Key]; ok {
		at := s.fsDirs[a.Key]
		s.mu.Unlock()
		if filepath.Clean(at) != filepath.Clean(a.FSDir) {
			return fmt.Errorf("lazy layer %s is served at %s already", a.Key, at)
		}
		return nil // a berthd that died after the mount hands it over again
	}
	done := make(chan struct{})
	s.mounting[a.Key] = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.mounting, a.Key)
		close(done)
		s.mu.Unlock()
	}()
	return s.mountLayer(a)
}

// waitMountingLocked waits, with mu held but released meanwhile, until no
// mount of key is under way.
func (s *Server) waitMountingLocked(key string) {
	for done, ok := s.mounting[key]; ok; done, ok = s.mounting[key] {
		if s.mountWaits != nil {
			s.mountWaits(key)
		}
		s.mu.Unlock()
		<-done
		s.mu.Lock()
	}
}

func (s *Server) mountLayer(a MountArgs) error {
	var src lazy.Source
	if a.Source != nil {
		src = &source{spec: *a.Source}
	}
	l, err := lazy.Load(a.Dir, src, lazy.Options{Log: s.opts.Log.With("layer", a.Key), StallTimeout: a.StallTimeout,
		ReadFailed: func() { s.readFailures.Add(1) }, Find: s.findChunk, Inflate: s.opts.Inflate, Fetches: s.fetches,
		Broken: func(err error) { s.markBroken(a.Key, err) }})
	if err != nil {
		return err
	}
	if err := l.Mount(a.FSDir); err != nil {
		l.Close()
		return fmt.Errorf("mount lazy layer %s: %w", a.Key, err)
	}
	s.fetches.Note() // a pull is under way
	crashpoint.Hit("lazy serve", "layer mounted")
	s.mu.Lock()
	s.layers[a.Key], s.fsDirs[a.Key] = l, a.FSDir
	s.mu.Unlock()
	s.opts.Log.Info("serving lazy layer", "layer", a.Key, "at", a.FSDir, "registry", a.Source != nil)
	return nil
}

func (s *Server) markBroken(key string, err error) {
	s.verificationFailures.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.broken[key] = err.Error()
	s.events++
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) layer(key string) (*lazy.Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.layers[key]
	if !ok {
		return nil, fmt.Errorf("lazy layer %s is not served", key)
	}
	return l, nil
}

// complete starts the background fetch of key, once at a time: a berthd
// that restarted asks again for the layers it finds incomplete, and one
// whose fetch ended incomplete (a registry away) is fetched again then,
// if retryIncomplete has not done so already.
func (s *Server) complete(key string) error {
	// The pull that asks has just fetched its prioritised files, and its
	// container is about to start: the background fetch waits its turn.
	s.fetches.Note()
	return s.startFetch(key)
}

// startFetch starts the background fetch of key unless one runs or the
// layer is complete.
func (s *Server) startFetch(key string) error {
	l, err := s.layer(key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	started := s.completing[key]
	s.completing[key] = true
	s.mu.Unlock()
	if !started && !l.IsComplete() {
		go s.retryIncomplete(key, l, l.Complete())
	}
	return nil
}

// demandLease is a pull's fetch of a layer's prioritised files, held as
// demand (lazy.Fetches) until berthd ends it or its lease runs out.
type demandLease struct {
	end      func() // the demand's
	deadline time.Time
	timer    *time.Timer // runs expire at the deadline
}

// demand opens a pull's demand (a.ID), or renews it, to last a.For from
// now. berthd, not the server, fetches a new layer's prioritised files,
// and its container is about to start on them: the other layers'
// background fetches wait meanwhile, as for a container's read. A
// renewal of a demand that ended or ran out opens nothing: one that
// arrives late, after the end, would hold the fetches for a lease more.
func (s *Server) demand(a DemandArgs) error {
	if a.For <= 0 {
		return fmt.Errorf("demand %s: its lease %v is not positive", a.ID, a.For)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The deadline is set before the timer: when the timer fires, expire
	// finds it passed.
	deadline := time.Now().Add(a.For)
	if l, ok := s.demands[a.ID]; ok {
		l.deadline = deadline
		l.timer.Reset(a.For)
		return nil
	}
	if a.Renew {
		return fmt.Errorf("demand %s is not open: it ended, or its lease ran out", a.ID)
	}
	l := &demandLease{end: s.fetches.Demand(), deadline: deadline}
	l.timer = time.AfterFunc(a.For, func() { s.expire(a.ID, l) })
	s.demands[a.ID] = l
	return nil
}

// expire ends the demand l of id once its lease ran out: its berthd died
// or is wedged mid-pull. A renewal after the timer fired moved the
// deadline and set the timer again: l stands until then.
func (s *Server) expire(id string, l *demandLease) {
	s.mu.Lock()
	if s.demands[id] != l || time.Now().Before(l.deadline) {
		s.mu.Unlock()
		return
	}
	delete(s.demands, id)
	s.mu.Unlock()
	l.end()
	s.opts.Log.Warn("a pull's demand ran out without its end: its berthd died or is wedged; background fetches go on", "demand", id)
}

// endDemand ends the demand id; one that ran out is gone already.
func (s *Server) endDemand(id string) {
	s.mu.Lock()
	l, ok := s.demands[id]
	delete(s.demands, id)
	s.mu.Unlock()
	if ok {
		l.timer.Stop()
		l.end()
	}
}

// retryIncomplete starts the background fetch of l, served as key, again
// completeRetry after a run that ended with chunks missing, until the
// layer is complete, broken or no longer served. The retry is no demand:
// it does not hold the other layers' background fetches (Fetches.Note).
func (s *Server) retryIncomplete(key string, l *lazy.Layer, ended <-chan struct{}) {
	<-ended
	s.mu.Lock()
	retry := s.layers[key] == l && !l.IsComplete() && s.broken[key] == ""
	if retry {
		delete(s.completing, key)
	}
	s.mu.Unlock()
	if !retry {
		return
	}
	select {
	case <-time.After(completeRetry):
	case <-s.closed:
		return
	}
	// Unmounted meanwhile (its Close ended the run above), maybe mounted
	// again since: a new layer's fetch waits for its own pull's Complete.
	s.mu.Lock()
	same := s.layers[key] == l
	s.mu.Unlock()
	if same {
		s.startFetch(key) // an error: no longer served
	}
}

// unmount stops serving key, once a mount of it under way has ended; a
// layer still mounted in an overlay stays.
func (s *Server) unmount(key string) error {
	s.mu.Lock()
	s.waitMountingLocked(key)
	s.mu.Unlock()
	l, err := s.layer(key)
	if err != nil {
		return nil // gone already
	}
	if err := l.Close(); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.layers, key)
	delete(s.fsDirs, key)
	delete(s.broken, key)
	delete(s.completing, key)
	s.mu.Unlock()
	s.opts.Log.Info("stopped serving lazy layer", "layer", key)
	return nil
}

func (s *Server) status(a StatusArgs) Status {
	s.mu.Lock()
	if a.Wait && s.events <= a.After {
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-s.closed:
		case <-time.After(waitBound):
		}
		s.mu.Lock()
	}
	st := Status{Version: servedVersion, Events: s.events, Layers: map[string]LayerStatus{},
		ReadFailures: s.readFailures.Load(), VerificationFailures: s.verificationFailures.Load(), Demands: len(s.demands)}
	layers := maps.Clone(s.layers)
	for key := range layers {
		st.Layers[key] = LayerStatus{Broken: s.broken[key], FSDir: s.fsDirs[key]}
	}
	s.mu.Unlock()
	// The caches are measured outside mu: that reads their folders, and
	// mounts, reads and other calls need mu meanwhile.
	for key, l := range layers {
		ls := st.Layers[key]
		ls.DiskBytes, ls.FullSize, ls.Complete = l.DiskBytes(), l.FullSize(), l.IsComplete()
		st.Layers[key] = ls
	}
	return st
}

// findChunk names a cached chunk of digest d in one of the served layers:
// what a partial pull links rather than fetches. The layers are asked
// outside mu: a read being served may be looking here too.
func (s *Server) findChunk(d digest.Digest) (string, bool) {
	s.mu.Lock()
	layers := make([]*lazy.Layer, 0, len(s.layers))
	for _, l := range s.layers {
		layers = append(layers, l)
	}
	s.mu.Unlock()
	for _, l := range layers {
		if p, ok := l.CachedChunk(d); ok {
			return p, true
		}
	}
	return "", false
}

// exit stops the server if it serves no layer.
func (s *Server) exit() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.layers); n > 0 {
		return fmt.Errorf("%d lazy layers are still served", n)
	}
	select {
	case <-s.closed:
	default:
		// Both files go before the answer: the berthd that asked may start
		// a successor as soon as it has it.
		s.removePIDFile()
		close(s.closed)
		s.ln.Close()
		s.opts.Log.Info("no lazy layer left to serve: exiting")
	}
	return nil
}

// api is the server's methods as net/rpc calls them.
type api struct{ s *Server }

func (a *api) Mount(args MountArgs, _ *Empty) error { return a.s.mount(args) }

func (a *api) Complete(key string, _ *Empty) error { return a.s.complete(key) }

func (a *api) Demand(args DemandArgs, _ *Empty) error { return a.s.demand(args) }

func (a *api) EndDemand(id string, _ *Empty) error {
	a.s.endDemand(id)
	return nil
}

func (a *api) Unmount(key string, _ *Empty) error { return a.s.unmount(key) }

func (a *api) Status(args StatusArgs, reply *Status) error {
	*reply = a.s.status(args)
	return nil
}

func (a *api) FindChunk(d string, reply *ChunkReply) error {
	reply.Path, reply.Found = a.s.findChunk(digest.Digest(d))
	return nil
}

func (a *api) Exit(_ Empty, _ *Empty) error { return a.s.exit() }
