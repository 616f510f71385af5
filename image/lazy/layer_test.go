package lazy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-runtime/berth/image/gunzip"
	berthreg "github.com/berth-runtime/berth/image/registry"
	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
)

// tarOf makes a tar of regular files, in order.
func tarOf(t *testing.T, files ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// build makes an eStargz blob of tarball, in 4 KiB chunks, and returns it
// with its TOC digest. The files a tar puts before a ".prefetch.landmark"
// are its prioritised files.
func build(t *testing.T, tarball []byte) ([]byte, digest.Digest) {
	t.Helper()
	var buf bytes.Buffer
	w := estargz.NewWriter(&buf)
	w.ChunkSize = 4 << 10
	if err := w.AppendTar(bytes.NewReader(tarball)); err != nil {
		t.Fatal(err)
	}
	toc, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), toc
}

// retoc rewrites the TOC of blob with edit, in place (the footer, which
// holds the TOC's offset, stays valid), and returns the new blob and TOC
// digest: what an image whose TOC lies about a chunk's digest would be.
func retoc(t *testing.T, blob []byte, edit func(*estargz.JTOC)) ([]byte, digest.Digest) {
	t.Helper()
	tocOff, footer, err := estargz.OpenFooter(io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob))))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob[tocOff : int64(len(blob))-footer]))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	var toc estargz.JTOC
	if err := json.NewDecoder(tr).Decode(&toc); err != nil {
		t.Fatal(err)
	}
	edit(&toc)
	js, err := json.Marshal(toc)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: estargz.TOCTarName, Mode: 0o644, Size: int64(len(js)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(js)
	tw.Close()
	zw.Close()
	out := append(append(append([]byte(nil), blob[:tocOff]...), buf.Bytes()...), blob[int64(len(blob))-footer:]...)
	return out, digest.FromBytes(js)
}

// serve pushes blob to a registry on loopback and returns its fetcher.
func serve(t *testing.T, blob []byte) (Source, Blob) {
	t.Helper()
	return serveStalling(t, blob, new(atomic.Bool))
}

// serveStalling is serve with a registry whose blob GETs, while stall is
// set, get no answer until the client gives up.
func serveStalling(t *testing.T, blob []byte, stall *atomic.Bool) (Source, Blob) {
	t.Helper()
	return serveThrough(t, blob, func(w http.ResponseWriter, r *http.Request) bool {
		if stall.Load() && strings.Contains(r.URL.Path, "/blobs/sha256:") && r.Method == http.MethodGet {
			<-r.Context().Done()
			return true
		}
		return false
	})
}

// serveThrough is serve with a registry whose requests go to answer
// first; those it does not answer (false) go to the registry.
func serveThrough(t *testing.T, blob []byte, answer func(http.ResponseWriter, *http.Request) bool) (Source, Blob) {
	t.Helper()
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !answer(w, r) {
			reg.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	repo, err := name.NewRepository(strings.TrimPrefix(srv.URL, "http://")+"/lazy", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(repo, static.NewLayer(blob, types.OCILayer)); err != nil {
		t.Fatal(err)
	}
	return berthreg.NewBlobs(http.DefaultTransport, repo), Blob{Digest: digest.FromBytes(blob), Size: int64(len(blob))}
}

func readAll(l *Layer, name string) ([]byte, error) {
	e, ok := l.toc.Lookup(name)
	if !ok {
		return nil, io.ErrUnexpectedEOF
	}
	buf := make([]byte, e.Size)
	n, err := l.readAt(e, buf, 0)
	return buf[:n], err
}

func TestPrepareFetchesPrioritisedThenReadsOnDemand(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<10) // 16 KiB: four chunks
	blob, toc := build(t, tarOf(t, [2]string{"prio", "first"}, [2]string{estargz.PrefetchLandmark, "\x0f"}, [2]string{"big", big}))
	src, b := serve(t, blob)
	b.TOCDigest = toc
	dir := t.TempDir()
	if _, _, err := Prepare(context.Background(), dir, src, b, Options{}); err != nil {
		t.Fatal(err)
	}
	cached, err := Load(dir, nil, Options{}) // no registry: only what Prepare fetched
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(cached, "prio"); err != nil || string(got) != "first" {
		t.Fatalf("prioritised file from the cache: %q, %v", got, err)
	}
	if _, err := readAll(cached, "big"); err == nil {
		t.Fatal("a file Prepare did not fetch read without a registry")
	}
	l, err := Load(dir, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(l, "big"); err != nil || string(got) != big {
		t.Fatalf("big file on demand: %d bytes, %v", len(got), err)
	}
}

func TestChunkFailingItsDigestFailsTheRead(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<10)
	blob, _ := build(t, tarOf(t, [2]string{"big", big}))
	// The TOC (and the annotation's digest, which the test gives) says
	// the third chunk is other bytes than the blob holds.
	blob, toc := retoc(t, blob, func(j *estargz.JTOC) {
		n := 0
		for _, e := range j.Entries {
			if (e.Type == "chunk" || e.Name == "big") && e.ChunkDigest != "" {
				if n == 2 {
					e.ChunkDigest = digest.FromString("other bytes").String()
				}
				n++
			}
		}
	})
	src, b := serve(t, blob)
	b.TOCDigest = toc
	dir := t.TempDir()
	if _, _, err := Prepare(context.Background(), dir, src, b, Options{}); err != nil {
		t.Fatal(err)
	}
	l, err := Load(dir, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAll(l, "big")
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("read of a file with a chunk failing its digest: %v, want a digest mismatch", err)
	}
	if len(got) != 8<<10 || string(got) != big[:8<<10] {
		t.Fatalf("the read returned %d bytes before the bad chunk, want the two good chunks' 8192", len(got))
	}
}

func TestTOCNotMatchingTheAnnotationIsRefused(t *testing.T) {
	blob, _ := build(t, tarOf(t, [2]string{"f", "x"}))
	src, b := serve(t, blob)
	b.TOCDigest = digest.FromString("another TOC")
	if _, _, err := Prepare(context.Background(), t.TempDir(), src, b, Options{}); err == nil {
		t.Fatal("Prepare took a TOC that does not match the descriptor's digest")
	}
}

func TestBlobWithoutFooterIsNotLazy(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(tarOf(t, [2]string{"f", "x"}))
	zw.Close()
	src, b := serve(t, buf.Bytes())
	b.TOCDigest = digest.FromString("toc")
	if _, _, err := Prepare(context.Background(), t.TempDir(), src, b, Options{}); !errors.Is(err, ErrNotLazy) {
		t.Fatalf("Prepare of a plain gzip layer: %v, want ErrNotLazy", err)
	}
}

func TestStalledFetchFailsTheRead(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<10)
	blob, toc := build(t, tarOf(t, [2]string{"big", big}))
	stall := new(atomic.Bool)
	src, b := serveStalling(t, blob, stall)
	b.TOCDigest = toc
	dir := t.TempDir()
	if _, _, err := Prepare(context.Background(), dir, src, b, Options{}); err != nil {
		t.Fatal(err)
	}
	l, err := Load(dir, src, Options{StallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stall.Store(true)
	start := time.Now()
	if _, err := readAll(l, "big"); !errors.Is(err, ErrStalled) {
		t.Fatalf("read from a registry that stopped sending: %v, want ErrStalled", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the stalled read failed after %s, want about the 200 ms stall timeout", took)
	}
}

func TestSharedGzipMembersAreNotLazy(t *testing.T) {
	tarball := tarOf(t, [2]string{"a", "small"}, [2]string{"b", "files"}, [2]string{"c", "together"})
	esgz, err := estargz.Build(io.NewSectionReader(bytes.NewReader(tarball), 0, int64(len(tarball))), estargz.WithMinChunkSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer esgz.Close()
	blob, err := io.ReadAll(esgz)
	if err != nil {
		t.Fatal(err)
	}
	src, b := serve(t, blob)
	b.TOCDigest = esgz.TOCDigest()
	if _, _, err := Prepare(context.Background(), t.TempDir(), src, b, Options{}); !errors.Is(err, ErrNotLazy) {
		t.Fatalf("Prepare of a layer whose files share gzip members: %v, want ErrNotLazy (pulled whole)", err)
	}
}

// serveAs is serve with a registry that answers the blob's GETs with
// served instead: the bytes a lying registry (or a tampered store) gives
// for the digest the manifest names.
func serveAs(t *testing.T, blob, served []byte) (Source, Blob) {
	t.Helper()
	return serveThrough(t, blob, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/blobs/"+digest.FromBytes(blob).String()) && r.Method == http.MethodGet {
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(served))
			return true
		}
		return false
	})
}

// diffID is the digest of blob uncompressed.
func diffID(t *testing.T, blob []byte) digest.Digest {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	d, err := digest.Canonical.FromReader(zr)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// completeLayer prepares the layer of blob (served as served), fetches the
// rest in the background, and waits until it is complete or broken.
func completeLayer(t *testing.T, blob, served []byte, toc, diff digest.Digest, inflate func(io.Reader) (io.ReadCloser, error)) (l *Layer, dir string, broken error) {
	t.Helper()
	src, b := serveAs(t, blob, served)
	b.TOCDigest, b.DiffID = toc, diff
	dir = t.TempDir()
	if _, _, err := Prepare(context.Background(), dir, src, b, Options{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	l, err := Load(dir, src, Options{Broken: func(err error) { done <- err }, Inflate: inflate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	l.Complete()
	l.background.Wait()
	select {
	case broken = <-done:
	default:
	}
	return l, dir, broken
}

// TestCompleteLayerIsVerified: a layer matching its digests is marked
// complete, through each gzip decoder berthd may inflate layers with (the
// blob's last member, the eStargz footer, has an extra field).
func TestCompleteLayerIsVerified(t *testing.T) {
	for _, mode := range []string{gunzip.Builtin, gunzip.ISAL} {
		t.Run(mode, func(t *testing.T) {
			d, err := gunzip.Choose(mode)
			if err != nil {
				t.Skipf("%s: %v (the builtin decoder's run covers the check)", mode, err)
			}
			testCompleteLayerIsVerified(t, d.NewReader)
		})
	}
}

func testCompleteLayerIsVerified(t *testing.T, inflate func(io.Reader) (io.ReadCloser, error)) {
	big := strings.Repeat("0123456789abcdef", 1<<10)
	blob, toc := build(t, tarOf(t, [2]string{"prio", "first"}, [2]string{estargz.PrefetchLandmark, "\x0f"}, [2]string{"big", big}))
	l, dir, broken := completeLayer(t, blob, blob, toc, diffID(t, blob), inflate)
	if broken != nil || !IsComplete(dir) || Broken(dir) != nil {
		t.Fatalf("a layer matching its digests: broken %v, complete %v", broken, IsComplete(dir))
	}
	if _, err := os.Stat(filepath.Join(dir, rawDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the compressed bytes kept for the verification are still there: %v", err)
	}
	if got, err := readAll(l, "big"); err != nil || string(got) != big {
		t.Fatalf("read of the complete layer: %d bytes, %v", len(got), err)
	}
}

// A registry serving other bytes than the manifest's digest names, whose
// chunks still match the TOC (here: another gzip header time on a chunk's
// member, which changes no uncompressed byte), or an image config whose
// diff ID is not the layer's: the complete layer is broken, every read
// fails, and it is never marked complete.
func TestCompleteLayerFailingItsDigestsBreaks(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<10)
	blob, toc := build(t, tarOf(t, [2]string{"prio", "first"}, [2]string{estargz.PrefetchLandmark, "\x0f"}, [2]string{"big", big}))
	r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob))))
	if err != nil {
		t.Fatal(err)
	}
	c, ok := r.ChunkEntryForOffset("big", 8<<10)
	if !ok {
		t.Fatal("no chunk of big at 8 KiB")
	}
	tampered := bytes.Clone(blob)
	tampered[c.Offset+4] ^= 0xff // the member's MTIME
	for _, tc := range []struct {
		name        string
		served      []byte
		diff        digest.Digest
		wantMessage string
	}{
		{"blob digest", tampered, diffID(t, blob), "blob digest mismatch"},
		{"diff ID", blob, digest.FromString("another layer"), "diff ID mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, dir, broken := completeLayer(t, blob, tc.served, toc, tc.diff, nil)
			if !errors.Is(broken, ErrVerification) || !strings.Contains(broken.Error(), tc.wantMessage) {
				t.Fatalf("Broken called with %v, want ErrVerification: %s", broken, tc.wantMessage)
			}
			if IsComplete(dir) || !errors.Is(Broken(dir), ErrVerification) {
				t.Errorf("after the failed verification: complete %v, broken %v", IsComplete(dir), Broken(dir))
			}
			if _, err := readAll(l, "prio"); !errors.Is(err, ErrVerification) {
				t.Errorf("read of a broken layer's cached file: %v, want ErrVerification", err)
			}
			again, err := Load(dir, nil, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := readAll(again, "prio"); !errors.Is(err, ErrVerification) {
				t.Errorf("read of a broken layer loaded again: %v, want ErrVerification", err)
			}
		})
	}
}

// A layer with chunks linked from another layer's cache (a partial pull)
// completes on its chunk digests and TOC: the registry serves none of the
// linked chunks' bytes, not even for the whole-blob check, which is not
// made (the image config's diff ID here is wrong, and goes unnoticed).
func TestLinkedLayerCompletesWithoutTheLinkedBytes(t *testing.T) {
	// Random, so that what follows big compresses to more than the 1 KiB
	// before the TOC that Prepare fetches with it.
	random := make([]byte, 18<<10)
	rand.Read(random)
	big, small := string(random[:16<<10]), string(random[16<<10:])
	first, firstTOC := build(t, tarOf(t, [2]string{"prio", "first"}, [2]string{estargz.PrefetchLandmark, "\x0f"}, [2]string{"big", big}))
	lender, _, broken := completeLayer(t, first, first, firstTOC, diffID(t, first), nil)
	if broken != nil {
		t.Fatal(broken)
	}
	second, secondTOC := build(t, tarOf(t, [2]string{"prio", "second"}, [2]string{estargz.PrefetchLandmark, "\x0f"}, [2]string{"big", big}, [2]string{"small", small}))
	var mu sync.Mutex
	var ranges []string
	src, b := serveThrough(t, second, func(_ http.ResponseWriter, r *http.Request) bool {
		if strings.Contains(r.URL.Path, "/blobs/sha256:") && r.Method == http.MethodGet {
			mu.Lock()
			ranges = append(ranges, r.Header.Get("Range"))
			mu.Unlock()
		}
		return false
	})
	b.TOCDigest, b.DiffID = secondTOC, digest.FromString("another layer")
	dir := t.TempDir()
	opts := Options{Find: lender.CachedChunk, Broken: func(err error) { t.Errorf("Broken: %v", err) }}
	if _, _, err := Prepare(context.Background(), dir, src, b, opts); err != nil {
		t.Fatal(err)
	}
	l, err := Load(dir, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	l.Complete()
	l.background.Wait()
	if !IsComplete(dir) {
		t.Fatal("the layer with linked chunks is not complete")
	}

	r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(second), 0, int64(len(second))))
	if err != nil {
		t.Fatal(err)
	}
	firstChunk, ok1 := r.ChunkEntryForOffset("big", 0)
	lastChunk, ok2 := r.ChunkEntryForOffset("big", int64(len(big))-1)
	if !ok1 || !ok2 {
		t.Fatal("big has no first or last chunk")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, rg := range ranges {
		var start, last int64
		if _, err := fmt.Sscanf(rg, "bytes=%d-%d", &start, &last); err != nil || start < lastChunk.NextOffset() && last >= firstChunk.Offset {
			t.Errorf("the registry served %q, over the linked chunks (bytes %d-%d); all: %v", rg, firstChunk.Offset, lastChunk.NextOffset()-1, ranges)
		}
	}
	for name, want := range map[string]string{"big": big, "small": small, "prio": "second"} {
		if got, err := readAll(l, name); err != nil || string(got) != want {
			t.Errorf("read %s of the complete layer: %d bytes, %v", name, len(got), err)
		}
	}
}

// TestPrioritisedRunsAreFetchedInParallel checks that Prepare asks for the
// runs of the prioritised files at the same time, not one after another:
// each request for the prioritised bytes is held until another is in
// flight (or 10 s passed, which fails the test).
func TestPrioritisedRunsAreFetchedInParallel(t *testing.T) {
	noise := make([]byte, 3*groupBytes) // incompressible: three runs
	rand.Read(noise)
	blob, toc := build(t, tarOf(t, [2]string{"prio", string(noise)}, [2]string{estargz.PrefetchLandmark, "\x0f"}))
	tocOff, _, err := estargz.OpenFooter(io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob))))
	if err != nil {
		t.Fatal(err)
	}
	var inFlight atomic.Int32
	together := make(chan struct{})
	var once sync.Once
	src, b := serveThrough(t, blob, func(w http.ResponseWriter, r *http.Request) bool {
		var start int64
		if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-", &start); err != nil || start >= tocOff {
			return false // the footer and TOC, fetched one after the other
		}
		if inFlight.Add(1) >= 2 {
			once.Do(func() { close(together) })
		}
		select {
		case <-together:
		case <-time.After(10 * time.Second):
		}
		inFlight.Add(-1)
		return false
	})
	b.TOCDigest = toc
	dir := t.TempDir()
	if _, _, err := Prepare(context.Background(), dir, src, b, Options{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-together:
	default:
		t.Fatal("no two requests for the prioritised files were in flight together")
	}
	cached, err := Load(dir, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(cached, "prio"); err != nil || !bytes.Equal(got, noise) {
		t.Fatalf("prioritised file from the cache: %d bytes, %v", len(got), err)
	}
}
