package image

import (
	"errors"
	"log/slog"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-runtime/berth/image/lazy"
	"github.com/berth-runtime/berth/image/lazyd"
	"github.com/berth-runtime/berth/test/harness"
)

// wedgedLazyServer answers berthd's calls on a lazy layer server's socket
// as one that is alive but slow: Mount and Status answer only once
// released, Unmount and Exit at once. It records the layers it serves.
type wedgedLazyServer struct {
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	served  []string
}

// wedgedLazyAPI is its methods as net/rpc calls them.
type wedgedLazyAPI struct{ w *wedgedLazyServer }

func (a *wedgedLazyAPI) Mount(args lazyd.MountArgs, _ *lazyd.Empty) error {
	<-a.w.release
	a.w.mu.Lock()
	defer a.w.mu.Unlock()
	a.w.served = append(a.w.served, args.Key)
	return nil
}

func (a *wedgedLazyAPI) Unmount(key string, _ *lazyd.Empty) error {
	a.w.mu.Lock()
	defer a.w.mu.Unlock()
	a.w.served = slices.DeleteFunc(a.w.served, func(k string) bool { return k == key })
	return nil
}

func (a *wedgedLazyAPI) Status(_ lazyd.StatusArgs, st *lazyd.Status) error {
	<-a.w.release
	st.Version = lazyd.ProtocolVersion
	return nil
}

func (a *wedgedLazyAPI) Exit(_ lazyd.Empty, _ *lazyd.Empty) error { return nil }

func (w *wedgedLazyServer) servedKeys() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.served)
}

// serveWedged serves a wedgedLazyServer in dir until the test ends.
func serveWedged(t *testing.T, dir string) *wedgedLazyServer {
	t.Helper()
	w := &wedgedLazyServer{release: make(chan struct{})}
	srv := rpc.NewServer()
	if err := srv.RegisterName("Lazy", &wedgedLazyAPI{w}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, lazyd.SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed at the test's end
			}
			go srv.ServeConn(conn)
		}
	}()
	t.Cleanup(w.unwedge)
	return w
}

// unwedge lets the calls held so far, and those to come, answer.
func (w *wedgedLazyServer) unwedge() { w.once.Do(func() { close(w.release) }) }

// A lazy layer server that does not answer in time is slow, not dead:
// its calls fail naming the socket (watchLazy's status, a Mount), and
// berthd keeps it with its layers (nothing detached or forgotten). A Mount
// it carries out after berthd gave up on it is undone through it when the
// snapshot is collected, before the folder goes: no layer stays served
// for a snapshot that is gone.
func TestLazyServerWithoutAnswer(t *testing.T) {
	defer func(d time.Duration) { lazyCallTimeout = d }(lazyCallTimeout)
	lazyCallTimeout = 200 * time.Millisecond
	dir := t.TempDir()
	var log harness.SyncBuffer
	s, _ := newTestServiceWith(t, func(o *Options) {
		o.LazyDir, o.LazyServer, o.Logger = dir, []string{"false"}, slog.New(slog.NewTextHandler(&log, nil))
	})
	w := serveWedged(t, dir)
	s.lazyMu.Lock()
	s.lazyServed["lazy a"] = true // a layer the server serves already
	s.lazyMu.Unlock()

	dirSnap, err := s.snaps.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.snaps.Commit("lazy b", dirSnap, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	mounted := make(chan error, 1)
	go func() { mounted <- s.mountLazy(snap, nil) }() // starts watchLazy too
	select {
	case err := <-mounted:
		if !errors.Is(err, lazyd.ErrNoAnswer) || !strings.Contains(err.Error(), lazyd.SocketFile) {
			t.Fatalf("Mount on a server that does not answer: %v, want ErrNoAnswer naming the socket", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Mount on a server that does not answer did not return within 10 s")
	}
	if !harness.Eventually(10*time.Second, func() bool { return strings.Contains(log.String(), "lazy layer server status") }) {
		t.Fatalf("watchLazy's status call did not fail on a server that does not answer; berthd's log:\n%s", log.String())
	}
	s.lazydMu.Lock()
	attached := s.lazyd != nil
	s.lazydMu.Unlock()
	s.lazyMu.Lock()
	staleA, staleB, servedA, servedB := s.lazyStale["lazy a"], s.lazyStale["lazy b"], s.lazyServed["lazy a"], s.lazyServed["lazy b"]
	s.lazyMu.Unlock()
	if !attached || staleA != "" || staleB == "" || !servedA || !servedB {
		t.Fatalf("after calls without an answer: server attached %v, a served %v (not to reuse: %q), b served %v (not to reuse: %q); "+
			"want the server kept with both layers, b not reused (its Mount may be carried out later, or never)", attached, servedA, staleA, servedB, staleB)
	}
	// A pull of b meanwhile takes its blob whole, not an error: new pods of
	// its image start while the old ones hold the layer.
	if err := s.ensureLazyLayer(t.Context(), "lazy b", lazy.Blob{}, layerSource{}, nil, nil); !errors.Is(err, lazy.ErrNotLazy) {
		t.Fatalf("a pull of the layer not to reuse: %v, want ErrNotLazy (pulled whole)", err)
	}

	w.unwedge() // the Mount berthd gave up on is carried out
	if !harness.Eventually(10*time.Second, func() bool { return slices.Contains(w.servedKeys(), "lazy b") }) {
		t.Fatal("the released Mount did not reach the server")
	}
	if err := s.removeSnapshot("lazy b"); err != nil {
		t.Fatal(err)
	}
	if got := w.servedKeys(); slices.Contains(got, "lazy b") {
		t.Fatalf("the server serves %v after the snapshot's removal, want lazy b unmounted first", got)
	}
	if _, err := os.Stat(filepath.Dir(s.snaps.Dir(snap))); !errors.Is(err, os.ErrNotExist) || s.lazyLayerStale("lazy b") != "" {
		t.Fatalf("after the snapshot's removal: its folder %v, not to reuse %q; want both gone", err, s.lazyLayerStale("lazy b"))
	}
}

// watchLazy's set of broken layers whose images it forgot keeps only the
// layers the server still serves: it does not grow with every layer that
// ever broke, and a layer collected, pulled again and broken again under
// its key has its images forgotten again, also when no status between the
// two breaks showed it gone.
func TestBrokenLayersArePruned(t *testing.T) {
	b := brokenLayers{keys: map[string]bool{}}
	broken := func(events uint64) lazyd.Status {
		return lazyd.Status{Events: events, Layers: map[string]lazyd.LayerStatus{"lazy a": {Broken: "blob digest mismatch"}, "lazy b": {}}}
	}
	if got := b.newlyBroken(broken(1)); !slices.Equal(got, []string{"lazy a"}) {
		t.Fatalf("first status with a broken layer: %v, want lazy a", got)
	}
	if got := b.newlyBroken(broken(1)); len(got) != 0 {
		t.Fatalf("the same status again: %v, want nothing new", got)
	}
	if got := b.newlyBroken(lazyd.Status{Events: 1, Layers: map[string]lazyd.LayerStatus{"lazy b": {}}}); len(got) != 0 || len(b.keys) != 0 {
		t.Fatalf("once lazy a is collected: newly broken %v, set %v; want both empty", got, b.keys)
	}
	if got := b.newlyBroken(broken(2)); !slices.Equal(got, []string{"lazy a"}) {
		t.Fatalf("lazy a pulled again and broken again: %v, want it forgotten again", got)
	}
	if got := b.newlyBroken(broken(3)); !slices.Equal(got, []string{"lazy a"}) {
		t.Fatalf("lazy a collected, pulled and broken again between two statuses: %v, want it forgotten again", got)
	}
}
