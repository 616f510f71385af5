package lazyd

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-runtime/berth/image/lazy"
	berthreg "github.com/berth-runtime/berth/image/registry"
	"github.com/berth-runtime/berth/test/harness"
	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// flakyLayer pushes an eStargz layer (a prioritised file, then 64 KiB in
// 4 KiB chunks) to a registry on loopback whose blob range requests fail
// with 503 while down is set.
func flakyLayer(t *testing.T, down *atomic.Bool) (berthreg.BlobSource, lazy.Blob) {
	t.Helper()
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	for _, f := range [][2]string{{"prio", "first"}, {estargz.PrefetchLandmark, "\x0f"}, {"big", strings.Repeat("0123456789abcdef", 4<<10)}} {
		tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg})
		tw.Write([]byte(f[1]))
	}
	tw.Close()
	var blob bytes.Buffer
	w := estargz.NewWriter(&blob)
	w.ChunkSize = 4 << 10
	if err := w.AppendTar(&tarball); err != nil {
		t.Fatal(err)
	}
	toc, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	diffID, err := digest.Canonical.FromReader(zr)
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() && r.Header.Get("Range") != "" {
			http.Error(w, "down for a while", http.StatusServiceUnavailable)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	repo, err := name.NewRepository(host+"/lazy", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(repo, static.NewLayer(blob.Bytes(), types.OCILayer)); err != nil {
		t.Fatal(err)
	}
	spec := berthreg.BlobSource{Hosts: map[string]berthreg.Host{host: {PlainHTTP: true}}, Domain: host, Endpoint: host, Path: "lazy"}
	return spec, lazy.Blob{Digest: digest.FromBytes(blob.Bytes()), Size: int64(blob.Len()), TOCDigest: toc, DiffID: diffID}
}

// preparedLayer is a layer of flakyLayer prepared (TOC and prioritised
// file fetched) in a snapshot-like folder: its Mount's arguments, as key k.
func preparedLayer(t *testing.T, down *atomic.Bool) MountArgs {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a FUSE mount needs root")
	}
	spec, blob := flakyLayer(t, down)
	snap := t.TempDir()
	a := MountArgs{Key: "k", Dir: filepath.Join(snap, "lazy"), FSDir: filepath.Join(snap, "fs"), Source: &spec, StallTimeout: 10 * time.Second}
	if err := os.Mkdir(a.FSDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(a.FSDir, unix.MNT_DETACH) }) // a failed run's, before the folder goes
	src, err := spec.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := lazy.Prepare(context.Background(), a.Dir, src, blob, lazy.Options{}); err != nil {
		t.Fatal(err)
	}
	return a
}

// unmountAndExit has the server stop serving k and exit, and checks that
// it left no mount at fsDir.
func unmountAndExit(t *testing.T, c *Client, done <-chan error, fsDir string) {
	t.Helper()
	if err := c.Unmount("k"); err != nil {
		t.Fatal(err)
	}
	if err := c.Exit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if mounted, err := mountinfo.Mounted(fsDir); err != nil || mounted {
		t.Fatalf("the layer's mount point after Unmount: mounted %v, %v", mounted, err)
	}
}

// A background fetch that the registry failed (down for a while) is
// started again by the server itself: once the registry serves again the
// layer completes, without berthd asking again. The server then leaves no
// mount.
func TestFailedBackgroundFetchIsRetried(t *testing.T) {
	defer func(d time.Duration) { completeRetry = d }(completeRetry)
	completeRetry = 20 * time.Millisecond
	var down atomic.Bool
	a := preparedLayer(t, &down)
	down.Store(true)
	var log harness.SyncBuffer
	c, done := serveLogging(t, t.TempDir(), &log)
	if err := c.Mount(a); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete("k"); err != nil {
		t.Fatal(err)
	}
	// Chunks the first run failed stay missing at its end, whatever the
	// later requests of the run get.
	if !harness.Eventually(20*time.Second, func() bool { return strings.Contains(log.String(), "background fetch failed") }) {
		t.Fatalf("the background fetch did not fail with the registry down; the server's log:\n%s", log.String())
	}
	down.Store(false)
	if !harness.Eventually(10*time.Second, func() bool { st, err := c.Status(); return err == nil && st.Layers["k"].Complete }) {
		st, err := c.Status()
		t.Fatalf("the layer did not complete once the registry served again: %+v, %v", st.Layers["k"], err)
	}
	unmountAndExit(t, c, done, a.FSDir)
}

// A Mount of a key already served is answered as done only for the same
// folder (a berthd that restarted hands the layer over again); at another
// folder it is refused naming where the layer is served: answered as done,
// berthd would take that empty folder for the layer.
func TestMountOfServedKeyElsewhereIsRefused(t *testing.T) {
	var down atomic.Bool
	a := preparedLayer(t, &down)
	c, done := serve(t, t.TempDir())
	if err := c.Mount(a); err != nil {
		t.Fatal(err)
	}
	if err := c.Mount(a); err != nil {
		t.Fatalf("the same Mount again: %v", err)
	}
	elsewhere := a
	elsewhere.FSDir = t.TempDir()
	if err := c.Mount(elsewhere); err == nil || !strings.Contains(err.Error(), a.FSDir) {
		t.Fatalf("a Mount of the served key at another folder: %v, want it refused naming %s", err, a.FSDir)
	}
	if mounted, err := mountinfo.Mounted(elsewhere.FSDir); err != nil || mounted {
		t.Fatalf("the other folder after the refused Mount: mounted %v, %v", mounted, err)
	}
	unmountAndExit(t, c, done, a.FSDir)
}
