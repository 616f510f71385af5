package integration

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// These tests pull through a harness.Proxy, which counts what berthd asks
// for and is sent, and cuts, stalls or slows the layer bodies.

// startBehindProxy starts a registry, a proxy in front of it and berthd
// pulling from the proxy.
func startBehindProxy(t *testing.T, extraTOML string) (*harness.Registry, *harness.Proxy, *harness.Daemon) {
	t.Helper()
	reg := harness.NewRegistry(t)
	px := harness.NewProxy(t, reg)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(px.Host()) + extraTOML})
	return reg, px, d
}

// randomLayers is an image of uncompressed layers of one file of random
// bytes each (so their blobs are as big as said), pushed to reg as
// repoTag; it returns the reference through px and the image.
func randomLayers(t *testing.T, reg *harness.Registry, px *harness.Proxy, repoTag string, sizes ...int) (string, harness.Pushed, v1.Image) {
	t.Helper()
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(time.Now().UnixNano()))
	rng := rand.NewChaCha8(seed)
	var layers [][]harness.File
	for i, n := range sizes {
		b := make([]byte, n)
		_, _ = rng.Read(b)
		layers = append(layers, []harness.File{harness.Reg(fmt.Sprint("random", i), string(b), 0o644)})
	}
	img := harness.NewImage(t, harness.ImageSpec{Compression: harness.Uncompressed, Layers: layers})
	p := reg.Push(t, repoTag, img)
	return px.Host() + "/" + repoTag, p, img
}

// partialFile is where berthd keeps the download of blob d to resume.
func partialFile(d *harness.Daemon, blob v1.Hash) string {
	return filepath.Join(d.Root, harness.IngestDir, harness.ResumableDir, blob.Algorithm+"-"+blob.Hex)
}

// partialOffset is the complete prefix berthd recorded for blob; -1: none.
func partialOffset(t *testing.T, d *harness.Daemon, blob v1.Hash) int64 {
	t.Helper()
	b, err := os.ReadFile(partialFile(d, blob) + ".offset")
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("offset file of %s: %q", blob, b)
	}
	return n
}

func assertNoPartial(t *testing.T, d *harness.Daemon, blob v1.Hash) {
	t.Helper()
	for _, p := range []string{partialFile(d, blob), partialFile(d, blob) + ".offset"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is still there after the blob completed or failed its digest", p)
		}
	}
}

// rangeStart is the first byte a GET's "bytes=N-M" asked for.
func rangeStart(t *testing.T, g harness.BlobGet) int64 {
	t.Helper()
	var start, end int64
	if _, err := fmt.Sscanf(g.Range, "bytes=%d-%d", &start, &end); err != nil {
		t.Fatalf("GET %s with Range %q: want bytes=FIRST-LAST", g.Digest, g.Range)
	}
	return start
}

// TestPullResumesCutConnection drops the layer's connection half way: the
// same pull asks for the rest with a Range request, so the proxy sends the
// blob's bytes about once, not once and a half.
func TestPullResumesCutConnection(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, px, d := startBehindProxy(t, "")
	ref, p, img := randomLayers(t, reg, px, "berth/cut:1", 8<<20)
	layer := harness.LayerDigests(t, img)[0]
	size := harness.BlobSize(t, img, layer)
	px.CutOnce(layer, size/2)

	mustPull(t, d, ref, p.ID)
	gets := px.Gets(layer)
	if len(gets) != 2 || gets[0].Range != "" {
		t.Fatalf("GETs of the layer: %+v; want the whole blob, then a range for the rest", gets)
	}
	if start := rangeStart(t, gets[1]); start < size*4/10 {
		t.Errorf("the retry asked from byte %d of %d, want from about %d (where the cut was)", start, size, size/2)
	}
	if sent := px.Sent(layer); sent > size+size/20 {
		t.Errorf("the proxy sent %d bytes of a %d-byte layer: the retry started over", sent, size)
	}
	assertNoPartial(t, d, layer)
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestPullRetriesTransientLayerErrors answers a layer's GET once with 503:
// the pull asks again after a pause and succeeds.
func TestPullRetriesTransientLayerErrors(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, px, d := startBehindProxy(t, "")
	ref, p, img := randomLayers(t, reg, px, "berth/flaky:1", 1<<20)
	layer := harness.LayerDigests(t, img)[0]
	px.FailOnce(layer, http.StatusServiceUnavailable)
	mustPull(t, d, ref, p.ID)
	if gets := px.Gets(layer); len(gets) != 2 || gets[0].Status != http.StatusServiceUnavailable || gets[1].Status != http.StatusOK {
		t.Errorf("GETs of the layer: %+v; want a 503, then the blob", gets)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestPullRangedRequestsAuthorized resumes a cut download at a registry
// that wants a bearer token, with a hosts.toml header for its host: the
// ranged request carries both, as the first one did.
func TestPullRangedRequestsAuthorized(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const user, pass = "alice", "s3cret"
	reg := harness.NewRegistry(t, harness.WithBearerAuth(user, pass))
	px := harness.NewProxy(t, reg)
	dir := t.TempDir()
	writeHostsTOML(t, dir, px.Host(), "server = \"http://"+px.Host()+"\"\n[header]\n  x-berth-secret = \"from-hosts-toml\"\n")
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: "[registry]\nconfig_path = \"" + dir + "\"\n"})
	ref, p, img := randomLayers(t, reg, px, "berth/private:1", 4<<20)
	layer := harness.LayerDigests(t, img)[0]
	px.CutOnce(layer, harness.BlobSize(t, img, layer)/2)

	auth := &runtimeapi.AuthConfig{Username: user, Password: pass, ServerAddress: px.Host()}
	if id, err := pull(t, d, ref, auth); err != nil || id != p.ID {
		t.Fatalf("PullImage(%s) = %q, %v; want %s", ref, id, err, p.ID)
	}
	gets := px.Gets(layer)
	if len(gets) != 2 || gets[1].Range == "" {
		t.Fatalf("GETs of the layer: %+v; want the whole blob, then a range", gets)
	}
	for i, g := range gets {
		if g.Status/100 != 2 || !strings.HasPrefix(g.Header.Get("Authorization"), "Bearer ") || g.Header.Get("X-Berth-Secret") != "from-hosts-toml" {
			t.Errorf("GET %d of the layer (Range %q): status %d, Authorization %q, X-Berth-Secret %q; want 2xx with the token and the header",
				i, g.Range, g.Status, g.Header.Get("Authorization"), g.Header.Get("X-Berth-Secret"))
		}
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestPullResumesAcrossPulls stops a pull half way (by the progress
// timeout, or by killing berthd) and checks that the next pull asks only
// for the rest, and that what it unpacks is the right blob.
func TestPullResumesAcrossPulls(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const size = 12 << 20
	cases := []struct {
		name string
		stop func(t *testing.T, px *harness.Proxy, d *harness.Daemon, ref string, layer v1.Hash, blobSize int64)
	}{
		{"progress-timeout", func(t *testing.T, px *harness.Proxy, d *harness.Daemon, ref string, layer v1.Hash, blobSize int64) {
			px.Stall(layer, blobSize/2)
			_, err := pullWithin(t, d, ref, nil, 30*time.Second)
			assertCode(t, err, []codes.Code{codes.DeadlineExceeded, codes.Unavailable, codes.Aborted}, "progress")
		}},
		{"berthd-killed", func(t *testing.T, px *harness.Proxy, d *harness.Daemon, ref string, layer v1.Hash, blobSize int64) {
			px.LimitRate(2 << 20) // 6 s for the layer
			done := make(chan error, 1)
			go func() {
				_, err := pullWithin(t, d, ref, nil, 30*time.Second)
				done <- err
			}()
			deadline := time.Now().Add(20 * time.Second)
			for partialOffset(t, d, layer) < 4<<20 {
				if time.Now().After(deadline) {
					t.Fatal("berthd recorded no offset of 4 MiB or more in 20 s")
				}
				time.Sleep(50 * time.Millisecond)
			}
			d.Kill()
			if err := <-done; err == nil {
				t.Fatal("the pull succeeded although berthd was killed")
			}
			px.LimitRate(0)
			d.Restart()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, px, d := startBehindProxy(t, harness.ImageTOML("2s"))
			ref, p, img := randomLayers(t, reg, px, "berth/resume:1", size)
			layer := harness.LayerDigests(t, img)[0]
			blobSize := harness.BlobSize(t, img, layer)

			c.stop(t, px, d, ref, layer, blobSize)
			offset := partialOffset(t, d, layer)
			if offset <= 0 {
				t.Fatalf("no partial download of %s kept after the pull stopped", layer)
			}
			px.Heal(layer)
			px.Reset()
			mustPull(t, d, ref, p.ID)
			gets := px.Gets(layer)
			if len(gets) != 1 || rangeStart(t, gets[0]) != offset {
				t.Fatalf("GETs of the layer in the second pull: %+v; want one, for the bytes from %d on", gets, offset)
			}
			if sent, rest := px.Sent(layer), blobSize-offset; sent != rest {
				t.Errorf("the second pull was sent %d bytes of the layer, want the %d that were missing", sent, rest)
			}
			if got := harness.FindInSnapshots(t, d.Root, "random0"); len(got) != 1 {
				t.Errorf("the layer's file is in %d snapshots, want 1", len(got))
			} else if fi, err := os.Stat(got[0]); err != nil || fi.Size() != size {
				t.Errorf("the layer's file after the resumed pull: %v, %v; want %d bytes", fi, err, size)
			}
			assertNoPartial(t, d, layer)
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

// TestPullDiscardsCorruptPartial corrupts the kept part of a download: the
// resumed pull fails the digest check of the whole blob and unpacks
// nothing, the partial file is gone, and the next pull fetches the whole
// blob again and succeeds.
func TestPullDiscardsCorruptPartial(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, px, d := startBehindProxy(t, harness.ImageTOML("2s"))
	ref, p, img := randomLayers(t, reg, px, "berth/corrupt:1", 4<<20)
	layer := harness.LayerDigests(t, img)[0]
	size := harness.BlobSize(t, img, layer)
	px.Stall(layer, size/2)
	if _, err := pullWithin(t, d, ref, nil, 30*time.Second); err == nil {
		t.Fatal("the stalled pull succeeded")
	}
	offset := partialOffset(t, d, layer)
	if offset <= 1<<20 {
		t.Fatalf("partial download of %s: offset %d, want more than 1 MiB", layer, offset)
	}
	f, err := os.OpenFile(partialFile(d, layer), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, offset/2); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, offset/2); err != nil {
		t.Fatal(err)
	}
	f.Close()
	px.Heal(layer)

	_, err = pull(t, d, ref, nil)
	if err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("pull resumed from a corrupted partial file: %v; want a digest mismatch", err)
	}
	assertAbsent(t, d, ref, p.ID)
	assertNoPartial(t, d, layer)
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))

	px.Reset()
	mustPull(t, d, ref, p.ID)
	if gets := px.Gets(layer); len(gets) != 1 || gets[0].Range != "" {
		t.Errorf("GETs of the layer after the digest failure: %+v; want one for the whole blob", gets)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestPullMaxConcurrentDownloads pulls an image of slow layers: unbounded,
// the proxy sends several at once; with max_concurrent_downloads = 1,
// never two.
func TestPullMaxConcurrentDownloads(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	cases := []struct {
		name    string
		toml    string
		wantMax func(int) bool
		want    string
	}{
		{"unset", "", func(n int) bool { return n >= 2 }, "at least 2"},
		{"one", "[image]\nmax_concurrent_downloads = 1\n", func(n int) bool { return n == 1 }, "exactly 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, px, d := startBehindProxy(t, c.toml)
			ref, p, img := randomLayers(t, reg, px, "berth/bounded:1", 1<<20, 1<<20, 1<<20)
			px.LimitRate(2 << 20) // half a second a layer
			px.Reset()
			mustPull(t, d, ref, p.ID)
			if n := px.MaxInFlight(); !c.wantMax(n) {
				t.Errorf("the proxy sent %d blobs at once at most, want %s", n, c.want)
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

// TestPullStallWithOneDownloadSlot stalls one layer's body while the
// pull's other layers wait for the node's one download slot, which that
// stalled download holds: the progress timeout still ends the pull (the
// waiting layers once paused its watch for good).
func TestPullStallWithOneDownloadSlot(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, px, d := startBehindProxy(t, "[image]\nmax_concurrent_downloads = 1\npull_progress_timeout = \"2s\"\n")
	ref, _, img := randomLayers(t, reg, px, "berth/oneslot:1", 1<<20, 1<<20, 1<<20)
	for _, layer := range harness.LayerDigests(t, img) {
		px.Stall(layer, 1<<19)
	}
	start := time.Now()
	_, err := pullWithin(t, d, ref, nil, 30*time.Second)
	assertCode(t, err, []codes.Code{codes.DeadlineExceeded, codes.Unavailable, codes.Aborted}, "progress")
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the stalled pull ended after %v; want the 2 s progress timeout to end it", took)
	}
}

// TestPullBigLayerInRanges pulls a layer over 64 MiB through a proxy that
// slows each connection: berthd splits it into ranges on several
// connections at once, and gets each byte once; bounded to one download it
// uses one connection.
func TestPullBigLayerInRanges(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const size = 66 << 20
	cases := []struct {
		name       string
		toml       string
		wantRanged bool
	}{
		{"ranges", "", true},
		{"one-download", "[image]\nmax_concurrent_downloads = 1\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, px, d := startBehindProxy(t, c.toml)
			ref, p, img := randomLayers(t, reg, px, "berth/big:1", size)
			layer := harness.LayerDigests(t, img)[0]
			blobSize := harness.BlobSize(t, img, layer)
			px.LimitRate(32 << 20)
			px.Reset()
			mustPull(t, d, ref, p.ID)
			gets := px.Gets(layer)
			if c.wantRanged {
				if len(gets) < 2 || px.MaxInFlight() < 2 {
					t.Errorf("%d GETs of the big layer, at most %d at once: %+v; want parallel ranges", len(gets), px.MaxInFlight(), gets)
				}
				for _, g := range gets {
					rangeStart(t, g) // each a range
				}
			} else if len(gets) != 1 || px.MaxInFlight() != 1 {
				t.Errorf("%d GETs of the big layer, at most %d at once, with one download allowed: %+v", len(gets), px.MaxInFlight(), gets)
			}
			// The first connection asked for all of it and is closed at its
			// part's end: it may have sent a little more.
			if sent := px.Sent(layer); sent < blobSize || sent > blobSize+8<<20 {
				t.Errorf("the proxy sent %d bytes of a %d-byte layer", sent, blobSize)
			}
			if got := harness.FindInSnapshots(t, d.Root, "random0"); len(got) != 1 {
				t.Errorf("the layer's file is in %d snapshots, want 1", len(got))
			} else if fi, err := os.Stat(got[0]); err != nil || fi.Size() != size {
				t.Errorf("the big file: %v, %v; want %d bytes", fi, err, size)
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

// TestPullBigLayerPartCut cuts the first of the connections a big layer is
// split into: that part asks again for its rest while the others go on,
// so the proxy sends each byte of the layer about once.
func TestPullBigLayerPartCut(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, px, d := startBehindProxy(t, "")
	ref, p, img := randomLayers(t, reg, px, "berth/bigcut:1", 66<<20)
	layer := harness.LayerDigests(t, img)[0]
	blobSize := harness.BlobSize(t, img, layer)
	px.LimitRate(32 << 20)
	px.CutOnce(layer, 8<<20) // the first connection, before the end of its part
	px.Reset()
	mustPull(t, d, ref, p.ID)
	gets := px.Gets(layer)
	if len(gets) < 5 || rangeStart(t, gets[0]) != 0 {
		t.Fatalf("GETs of the big layer: %+v; want the split ones and the cut part's rest", gets)
	}
	retried := false
	for _, g := range gets[1:] {
		retried = retried || rangeStart(t, g) == 8<<20
	}
	if !retried {
		t.Errorf("no GET asked for the cut part's rest from byte %d: %+v", 8<<20, gets)
	}
	if sent := px.Sent(layer); sent > blobSize+1<<20 {
		t.Errorf("the proxy sent %d bytes of a %d-byte layer: the cut cost the other parts' bytes", sent, blobSize)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}
