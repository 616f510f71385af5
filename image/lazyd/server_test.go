package lazyd

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-runtime/berth/image/lazy"
)

// serve runs a server in dir until it exits; the channel gives Serve's
// error then.
func serve(t *testing.T, dir string) (*Client, <-chan error) {
	t.Helper()
	return serveLogging(t, dir, io.Discard)
}

// serveLogging is serve with the server's log written to log.
func serveLogging(t *testing.T, dir string, log io.Writer) (*Client, <-chan error) {
	t.Helper()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(ServeOptions{Dir: dir, Fetches: 1, Log: slog.New(slog.NewTextHandler(log, nil))}, func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	c, err := Dial(dir, CallTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, done
}

// The socket's folder is made root's alone whatever mode it had, and the
// status says the protocol version.
func TestServeFolderRootOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lazyd")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c, done := serve(t, dir)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket folder mode: %v, %v; want 0700", fi.Mode(), err)
	}
	st, err := c.Status()
	if err != nil || st.Version != ProtocolVersion {
		t.Fatalf("Status = %+v, %v; want version %d", st, err, ProtocolVersion)
	}
	if err := c.Exit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// An exiting server removes its socket and pid file before it answers
// Exit, and never a successor's, which may start as soon as it answered.
func TestExitLeavesSuccessorsFiles(t *testing.T) {
	dir := t.TempDir()
	c, done := serve(t, dir)
	if err := c.Exit(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{SocketFile, PIDFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Fatalf("%s after Exit answered: %v, want it removed", f, err)
		}
	}
	next, nextDone := serve(t, dir)
	if err := <-done; err != nil {
		t.Fatalf("the first server: %v", err)
	}
	for _, f := range []string{SocketFile, PIDFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("the successor's %s after the first server returned: %v", f, err)
		}
	}
	if _, err := next.Status(); err != nil {
		t.Fatalf("the successor's status: %v", err)
	}
	if err := next.Exit(); err != nil {
		t.Fatal(err)
	}
	if err := <-nextDone; err != nil {
		t.Fatal(err)
	}
}

// A pull's demand lasts until its end, while its lease is renewed; one
// whose berthd died (no renewal, no end) runs out with its lease, and a
// late renewal does not open it again; a lease that is not positive is
// refused.
func TestDemandLease(t *testing.T) {
	c, _ := serve(t, t.TempDir())
	demands := func() int {
		t.Helper()
		st, err := c.Status()
		if err != nil {
			t.Fatal(err)
		}
		return st.Demands
	}

	end, err := c.demand(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Three leases long: it stands only if renewed.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if n := demands(); n != 1 {
			t.Fatalf("%d demands open while one is renewed, want 1", n)
		}
	}
	if err := end(); err != nil {
		t.Fatalf("end: %v", err)
	}
	if n := demands(); n != 0 {
		t.Fatalf("%d demands open after the end, want 0", n)
	}

	// A berthd that died: no renewal, no end.
	if err := c.call("Demand", DemandArgs{ID: "dead", For: 100 * time.Millisecond}, &Empty{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); demands() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a demand whose lease ran out still stands")
		}
	}
	// Its renewal, late, opens nothing.
	err = c.call("Demand", DemandArgs{ID: "dead", For: time.Hour, Renew: true}, &Empty{})
	if err == nil || !strings.Contains(err.Error(), "not open") {
		t.Fatalf("the renewal of a demand that ran out: %v, want an error saying it is not open", err)
	}
	if n := demands(); n != 0 {
		t.Fatalf("%d demands open after a late renewal, want 0", n)
	}

	err = c.call("Demand", DemandArgs{ID: "zero"}, &Empty{})
	if err == nil || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("a demand with no lease: %v, want an error naming the lease", err)
	}
	if n := demands(); n != 0 {
		t.Fatalf("%d demands open after a refused one, want 0", n)
	}
}

// An Unmount of a key whose Mount is under way (berthd gave up waiting for
// the Mount and collects the snapshot) waits until the mount ended and
// undoes it: the layer is not left served for a snapshot that is gone.
func TestUnmountWaitsForMountUnderWay(t *testing.T) {
	var down atomic.Bool
	spec, blob := flakyLayer(t, &down)
	dir := t.TempDir()
	src, err := spec.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := lazy.Prepare(context.Background(), dir, src, blob, lazy.Options{}); err != nil {
		t.Fatal(err)
	}
	l, err := lazy.Load(dir, nil, lazy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{opts: ServeOptions{Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		layers: map[string]*lazy.Layer{}, fsDirs: map[string]string{}, completing: map[string]bool{}, mounting: map[string]chan struct{}{}, broken: map[string]string{}}
	mounted, waiting := make(chan struct{}), make(chan struct{}, 1)
	s.mounting["k"] = mounted // as mount has it while the layer mounts
	s.mountWaits = func(string) { waiting <- struct{}{} }
	unmounted := make(chan error, 1)
	go func() { unmounted <- s.unmount("k") }()
	select {
	case err := <-unmounted:
		t.Fatalf("Unmount returned (%v) while the layer's mount was under way", err)
	case <-waiting:
	case <-time.After(time.Minute):
		t.Fatal("Unmount neither waited for the mount under way nor returned within a minute")
	}
	s.mu.Lock()
	s.layers["k"] = l
	delete(s.mounting, "k")
	close(mounted)
	s.mu.Unlock()
	if err := <-unmounted; err != nil {
		t.Fatal(err)
	}
	if _, err := s.layer("k"); err == nil {
		t.Fatal("the layer is served after the Unmount that waited for its mount")
	}
}
