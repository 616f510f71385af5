package integration

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/image/lazyd"
	"github.com/berth-runtime/berth/test/harness"
)

// lazyConfig turns lazy pulls on for a registry on plain HTTP, with a
// short hold of the background fetch, so that the tests that wait for a
// layer to complete do not wait the default 5 s each.
func lazyConfig(reg *harness.Registry) string {
	return lazyConfigFor(reg.Host(), 100*time.Millisecond)
}

// lazyConfigFor turns lazy pulls on for a plain HTTP registry at host, the
// background fetch held for quiet after the last on-demand fetch.
func lazyConfigFor(host string, quiet time.Duration) string {
	return harness.PlainHTTP(host) + fmt.Sprintf("\n[image]\nlazy = true\nlazy_fetch_quiet = %q\n", quiet)
}

// stargzLayer is an eStargz layer built by a test, and where its parts are
// in its blob.
type stargzLayer struct {
	blob      []byte
	digest    v1.Hash
	diffID    v1.Hash
	toc       digest.Digest
	tocOffset int64 // the TOC and footer are from here to the end
	prio      int64 // the prioritised files' chunks start here
	landmark  int64 // and end here
	bigChunk  int64 // the middle of the compressed bytes of a chunk of /data/big
	bigMember int64 // where that chunk's gzip member starts
	bigStart  int64 // the compressed bytes of /data/big's chunks are from here
	bigEnd    int64 // to here (exclusive)
	big       []byte
}

func (l *stargzLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *stargzLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *stargzLayer) Size() (int64, error)                { return int64(len(l.blob)), nil }
func (l *stargzLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *stargzLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}
func (l *stargzLayer) Uncompressed() (io.ReadCloser, error) {
	return gzip.NewReader(bytes.NewReader(l.blob))
}

// prioritised says whether a range of the blob (end exclusive) is what a
// lazy pull fetches before the container starts: the TOC and footer, or
// the prioritised files.
func (l *stargzLayer) prioritised(start, end int64) bool {
	return start >= l.tocOffset-1024 || end <= l.landmark
}

// prioritisedRange is prioritised for a Range header ("bytes=START-LAST").
func (l *stargzLayer) prioritisedRange(r string) bool {
	var start, last int64
	_, err := fmt.Sscanf(r, "bytes=%d-%d", &start, &last)
	return err == nil && l.prioritised(start, last+1)
}

// pulledRange says whether a Range header is one a lazy pull asks for:
// the footer or the TOC (from near the TOC to the blob's end), or the
// prioritised files' chunks. The background fetch's ranges start
// elsewhere: its runs start at another chunk, and what the blob's
// verification needs besides (its first tar header) at 0.
func (l *stargzLayer) pulledRange(r string) bool {
	var start, last int64
	_, err := fmt.Sscanf(r, "bytes=%d-%d", &start, &last)
	return err == nil && (start >= l.tocOffset-1024 && last+1 == int64(len(l.blob)) || start >= l.prio && last+1 <= l.landmark)
}

// stargzImage is busybox (plain gzip layers: the busybox files, then
// /opq/hidden) with one eStargz layer on top: /prio.txt prioritised,
// /data/big (1 MiB of random bytes, in 64 KiB chunks) and /data/small.txt
// not, a whiteout of /bin/top, /opq made opaque with /opq/shown in it.
// big is /data/big's content, random if nil; /data/id makes every layer
// the test builds another.
func stargzImage(t *testing.T, big []byte) (v1.Image, *stargzLayer) {
	t.Helper()
	if big == nil {
		big = make([]byte, 1<<20)
		rand.Read(big)
	}
	tarball := harness.TarBytes(t, []harness.File{
		harness.Reg("data/id", rand.Text(), 0o644),
		harness.Reg("prio.txt", "prioritised\n", 0o644),
		harness.Dir("data", 0o755),
		{Path: "data/big", Content: big, Mode: 0o644},
		harness.Reg("data/small.txt", "not prioritised\n", 0o644),
		harness.Dir("bin", 0o755),
		harness.Whiteout("bin/top"),
		harness.Dir("opq", 0o755),
		harness.OpaqueWhiteout("opq"),
		harness.Reg("opq/shown", "shown\n", 0o644),
	})
	b, err := estargz.Build(io.NewSectionReader(bytes.NewReader(tarball), 0, int64(len(tarball))),
		estargz.WithPrioritizedFiles([]string{"prio.txt"}), estargz.WithChunkSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	blob, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	l := &stargzLayer{blob: blob, toc: b.TOCDigest(), big: big}
	sr := io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob)))
	if l.tocOffset, _, err = estargz.OpenFooter(sr); err != nil {
		t.Fatal(err)
	}
	r, err := estargz.Open(sr)
	if err != nil {
		t.Fatal(err)
	}
	lm, ok := r.Lookup(estargz.PrefetchLandmark)
	if !ok {
		t.Fatal("the eStargz layer has no prefetch landmark")
	}
	l.landmark = lm.Offset
	prio, ok := r.Lookup("prio.txt")
	if !ok {
		t.Fatal("the eStargz layer has no /prio.txt")
	}
	l.prio = prio.Offset
	c, ok := r.ChunkEntryForOffset("data/big", 512<<10)
	if !ok {
		t.Fatal("/data/big has no chunk at 512 KiB")
	}
	l.bigChunk = (c.Offset + c.NextOffset()) / 2
	l.bigMember = c.Offset
	first, ok1 := r.ChunkEntryForOffset("data/big", 0)
	last, ok2 := r.ChunkEntryForOffset("data/big", int64(len(big))-1)
	if !ok1 || !ok2 {
		t.Fatal("/data/big has no first or last chunk")
	}
	l.bigStart, l.bigEnd = first.Offset, last.NextOffset()
	if l.digest, err = v1.NewHash(digest.FromBytes(blob).String()); err != nil {
		t.Fatal(err)
	}
	if l.diffID, err = v1.NewHash(b.DiffID().String()); err != nil {
		t.Fatal(err)
	}
	base := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{
		harness.Dir("opq", 0o755), harness.Reg("opq/hidden", "hidden\n", 0o644)}}})
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: l, Annotations: map[string]string{estargz.TOCJSONDigestAnnotation: l.toc.String()}})
	if err != nil {
		t.Fatal(err)
	}
	return img, l
}

// lazyMounts lists the lazy layers mounted under root.
func lazyMounts(t *testing.T, root string) []string {
	t.Helper()
	return harness.LazyMounts(root)
}

// lazyFolders lists the lazy layers' cache folders under root.
func lazyFolders(t *testing.T, root string) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(root, harness.SnapshotsDir, "*", "lazy"))
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// lazyPod starts a lazy-pull test: a registry serving an eStargz image
// (arrange sets its gates and faults before anything is pulled), a berthd
// with lazy pulls, and a sleeping container of the image pulled lazily.
func lazyPod(t *testing.T, arrange func(*harness.Registry, *stargzLayer)) (*harness.Registry, *stargzLayer, *podEnv, string) {
	t.Helper()
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	img, l := stargzImage(t, nil)
	arrange(reg, l)
	p := reg.Push(t, "berth/lazy:1", img)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(reg)})
	mustPull(t, d, p.Name, p.ID)
	e, ctr := runReader(t, d, reg, p.Name)
	return reg, l, e, ctr
}

// runReader runs a pod with a sleeping container of the pulled image ref.
func runReader(t *testing.T, d *harness.Daemon, reg *harness.Registry, ref string) (*podEnv, string) {
	t.Helper()
	e := newPodEnv(t, d, reg)
	e.image = ref
	podCfg := e.podConfig("lazy")
	return e, e.runContainer(t, e.runPod(t, podCfg), podCfg, e.ctrConfig("reader", sleeper...))
}

// waitComplete waits until n lazy layers under root are complete.
func waitComplete(t *testing.T, root string, n int) {
	t.Helper()
	if !eventually(time.Minute, func() bool {
		ok, _ := filepath.Glob(filepath.Join(root, harness.SnapshotsDir, "*", "lazy", "complete"))
		return len(ok) == n
	}) {
		t.Fatalf("%d lazy layers did not complete", n)
	}
}

// lazyPair is a berthd with lazy pulls that pulled the first of two
// eStargz images and completed its layer; the second is pushed, all of its
// layer but the TOC and prioritised files held back by the registry.
type lazyPair struct {
	reg           *harness.Registry
	d             *harness.Daemon
	first, second harness.Pushed
	l1, l2        *stargzLayer
}

// newLazyPair builds the pair; shareBig gives both images one /data/big.
func newLazyPair(t *testing.T, shareBig bool) lazyPair {
	t.Helper()
	harness.RequireIntegration(t)
	t.Parallel()
	var x lazyPair
	x.reg = harness.NewRegistry(t)
	img1, l1 := stargzImage(t, nil)
	var big []byte
	if shareBig {
		big = l1.big
	}
	img2, l2 := stargzImage(t, big)
	x.l1, x.l2 = l1, l2
	x.first, x.second = x.reg.Push(t, "berth/lazy:first", img1), x.reg.Push(t, "berth/lazy:second", img2)
	gateRest(x.reg, l2)
	x.d = harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(x.reg)})
	mustPull(t, x.d, x.first.Name, x.first.ID)
	waitComplete(t, x.d.Root, 1)
	return x
}

// gateRest makes the registry hold back every range of the layer but the
// TOC and the prioritised files until the test says.
func gateRest(reg *harness.Registry, l *stargzLayer) { reg.Gate(l.digest, l.prioritised) }

// assertPrioritisedOnly fails t unless every range of the layer's blob the
// registry served is the TOC or the prioritised files.
func assertPrioritisedOnly(t *testing.T, reg *harness.Registry, l *stargzLayer) {
	t.Helper()
	ranges := reg.Ranges(l.digest)
	if len(ranges) == 0 {
		t.Fatal("the registry served no range of the eStargz layer")
	}
	for _, r := range ranges {
		if !l.prioritisedRange(r) {
			t.Errorf("before the container started the registry served %q of the eStargz layer (TOC from %d, prioritised files up to %d); all: %v",
				r, l.tocOffset, l.landmark, ranges)
		}
	}
}

func TestPullLazyStartsBeforeFetched(t *testing.T) {
	reg, l, e, ctr := lazyPod(t, gateRest)
	pod := e.listPodIDs(t, nil)

	assertPrioritisedOnly(t, reg, l)
	if got := e.exec(t, ctr, "cat", "/prio.txt"); got.code != 0 || got.stdout != "prioritised\n" {
		t.Fatalf("cat /prio.txt: %+v, want the prioritised file", got)
	}
	// The layer's whiteouts hide what the layers below have.
	if got := e.exec(t, ctr, "sh", "-c", "ls /opq; test -e /bin/top && echo /bin/top"); got.stdout != "shown\n" {
		t.Fatalf("ls /opq and /bin/top through the lazy layer's whiteouts: %+v, want shown alone", got)
	}
	assertPrioritisedOnly(t, reg, l) // read from the cache, and directories from the TOC
	if m := lazyMounts(t, e.d.Root); len(m) != 1 {
		t.Fatalf("lazy mounts under berthd's root: %v, want the eStargz layer's alone", m)
	}

	reg.Ungate(l.digest)
	if got := e.execWithin(t, ctr, 60, "cat", "/data/big"); got.code != 0 || got.stdout != string(l.big) {
		t.Fatalf("cat /data/big: exit %d, %d bytes (equal: %v), stderr %q", got.code, len(got.stdout), got.stdout == string(l.big), got.stderr)
	}
	waitComplete(t, e.d.Root, 1)

	// A plain image pulls as it always did, lazy pulls on or not.
	plain := reg.Push(t, "berth/plain:1", harness.BusyboxImage(t, harness.ImageSpec{Config: v1.Config{Cmd: []string{"/bin/true"}}}))
	mustPull(t, e.d, plain.Name, plain.ID)
	if m := lazyMounts(t, e.d.Root); len(m) != 1 {
		t.Fatalf("lazy mounts after a plain pull: %v, want the eStargz layer's alone", m)
	}
	removeImage(t, e.d, plain.Name)

	// Removing the image and its container unmounts the layer and removes
	// its cache.
	for _, p := range pod {
		if _, err := e.d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
	}
	removeImage(t, e.d, e.image)
	if !eventually(30*time.Second, func() bool {
		return len(lazyMounts(t, e.d.Root)) == 0 && len(lazyFolders(t, e.d.Root)) == 0
	}) {
		t.Fatalf("after removal: lazy mounts %v, cache folders %v", lazyMounts(t, e.d.Root), lazyFolders(t, e.d.Root))
	}
	harness.AssertNoLeaks(t, e.d.Root, harness.WantSnapshots(0))
}

// TestPullLazyHoldsBackgroundFetch: the background fetch of a lazy layer
// sends its first request no earlier than lazy_fetch_quiet after the last
// on-demand request of the layer (the pull's footer, TOC and prioritised
// files) ended, as the proxy in front of the registry saw them, and still
// completes the layer. (A container's reads hold it too: the image/lazy
// unit tests show that, without a race between a test's read and the
// hold's end.)
func TestPullLazyHoldsBackgroundFetch(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const quiet = 2 * time.Second
	reg := harness.NewRegistry(t)
	px := harness.NewProxy(t, reg)
	img, l := stargzImage(t, nil)
	p := reg.Push(t, "berth/lazy:1", img)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfigFor(px.Host(), quiet)})
	mustPull(t, d, px.Host()+"/berth/lazy:1", p.ID)
	waitComplete(t, d.Root, 1)

	var demandEnd, backgroundStart time.Time
	var background []string
	for _, g := range px.Gets(l.digest) {
		if l.pulledRange(g.Range) {
			if g.End.After(demandEnd) {
				demandEnd = g.End
			}
			continue
		}
		background = append(background, g.Range)
		if backgroundStart.IsZero() || g.Start.Before(backgroundStart) {
			backgroundStart = g.Start
		}
	}
	if demandEnd.IsZero() || len(background) == 0 {
		t.Fatalf("the proxy saw no on-demand range (ended %v) or no background range (%v) of the eStargz layer: %+v", demandEnd, background, px.Gets(l.digest))
	}
	if gap := backgroundStart.Sub(demandEnd); gap < quiet {
		t.Fatalf("the first background request (of %v) began %v after the last on-demand request ended, want at least lazy_fetch_quiet %v", background, gap, quiet)
	}
}

// TestPullLazyPullHoldsBackgroundFetch: a pull's fetch of its layers'
// prioritised files holds the background fetch of the layers pulled
// before it for as long as it lasts, not only for lazy_fetch_quiet from
// its start or its end, and the held fetch resumes lazy_fetch_quiet after
// it (heldPulls); the registry holds B's layer for twice the quiet period.
// The proxy in front of the registry sees no request of A's background
// fetch start from B's first request until lazy_fetch_quiet after B's
// last one ended, and both layers complete; the server's log names both.
func TestPullLazyPullHoldsBackgroundFetch(t *testing.T) {
	const quiet = time.Second
	h := startHeldPulls(t, quiet)
	// What is asserted is that nothing happens meanwhile: B's prioritised
	// fetch lasts past the quiet period, which a mark at its start alone
	// would have let A's background fetch go on after.
	time.Sleep(2 * quiet)
	h.reg.Ungate(h.b.digest)
	if err := <-h.pulled; err != nil {
		t.Fatalf("PullImage(B): %v", err)
	}
	waitComplete(t, h.d.Root, 2)

	bStart, bEnd := h.px.Gets(h.b.digest)[0].Start, time.Time{}
	for _, g := range h.px.Gets(h.b.digest) {
		if h.b.pulledRange(g.Range) && g.End.After(bEnd) {
			bEnd = g.End
		}
	}
	h.assertHeld(t, bStart, bEnd, quiet, "image B's prioritised fetch ended")
	// The server writes its log itself (cri/daemonlog) into the file
	// berthd started it on.
	logs, err := os.ReadFile(filepath.Join(h.d.State, "lazyd", "lazyd.log"))
	if n := strings.Count(string(logs), "serving lazy layer"); err != nil || n != 2 {
		t.Errorf("lazyd.log names %d layers served (%v), want 2:\n%s", n, err, logs)
	}
}

// TestPullLazyKilledPullReleasesBackgroundFetch: a berthd killed while it
// fetches a layer's prioritised files (heldPulls, image B's) holds the
// background fetch of image A no longer than the lease of its demand at
// the server: the server ends it, saying so, A's background fetch resumes
// and completes the layer with no berthd running, at least
// lazy_fetch_quiet after the kill. (The next berthd carries on with the
// server: TestPullLazyServesWhileBerthdDown.)
func TestPullLazyKilledPullReleasesBackgroundFetch(t *testing.T) {
	const quiet = time.Second
	h := startHeldPulls(t, quiet)
	killed := time.Now()
	h.d.Kill()
	waitComplete(t, h.d.Root, 1)
	h.assertHeld(t, backgroundGets(h.px, h.a)[0].Start, killed, quiet, "berthd was killed")
	logs, err := os.ReadFile(filepath.Join(h.d.State, "lazyd", "lazyd.log"))
	if err != nil || !strings.Contains(string(logs), "a pull's demand ran out") {
		t.Errorf("lazyd.log (%v) does not say that the killed pull's demand ran out:\n%s", err, logs)
	}
}

// heldPulls are two eStargz images pulled through a proxy by a berthd
// that fetches in the background one request at a time: image A pulled,
// its background fetch under way (its chunks, then what the blob's
// verification needs besides), and image B's pull asking for its layer,
// which the registry holds back until the test ungates it.
type heldPulls struct {
	reg    *harness.Registry
	px     *harness.Proxy
	d      *harness.Daemon
	a, b   *stargzLayer
	pulled <-chan error // B's pull's
}

// startHeldPulls sets up heldPulls: it returns once A's first background
// request, under way when B's pull began, has ended.
func startHeldPulls(t *testing.T, quiet time.Duration) heldPulls {
	t.Helper()
	harness.RequireIntegration(t)
	t.Parallel()
	var h heldPulls
	h.reg = harness.NewRegistry(t)
	h.px = harness.NewProxy(t, h.reg)
	imgA, a := stargzImage(t, nil)
	imgB, b := stargzImage(t, nil)
	h.a, h.b = a, b
	pa, pb := h.reg.Push(t, "berth/lazy:a", imgA), h.reg.Push(t, "berth/lazy:b", imgB)
	gateRest(h.reg, a)
	h.d = harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfigFor(h.px.Host(), quiet) + "max_lazy_fetches = 1\n"})
	mustPull(t, h.d, h.px.Host()+"/berth/lazy:a", pa.ID)
	// The registry counts the GETs it holds back; the proxy, those answered.
	if !eventually(30*time.Second, func() bool { return h.reg.Fetches(a.digest) > len(h.px.Gets(a.digest)) }) {
		t.Fatalf("image A's background fetch sent no request; logs:\n%s", h.d.Logs())
	}

	h.reg.Gate(b.digest, func(int64, int64) bool { return false })
	pulled := make(chan error, 1)
	h.pulled = pulled
	go func() {
		id, err := pull(t, h.d, h.px.Host()+"/berth/lazy:b", nil)
		if err == nil && id != pb.ID {
			err = fmt.Errorf("image_ref %s, want the config digest %s", id, pb.ID)
		}
		pulled <- err
	}()
	if !eventually(30*time.Second, func() bool { return h.reg.Fetches(b.digest) > 0 }) {
		t.Fatal("image B's pull sent no request of its eStargz layer")
	}
	h.reg.Ungate(a.digest) // A's request under way ends; the next must wait
	if !eventually(30*time.Second, func() bool { g := backgroundGets(h.px, a); return len(g) > 0 && !g[0].End.IsZero() }) {
		t.Fatal("image A's first background request did not end once the registry let it through")
	}
	return h
}

// assertHeld fails t unless each request of A's background fetch that
// began after from began quiet after until (what) at least, and one did.
func (h heldPulls) assertHeld(t *testing.T, from, until time.Time, quiet time.Duration, what string) {
	t.Helper()
	var resumed int
	for _, g := range backgroundGets(h.px, h.a) {
		if !g.Start.After(from) {
			continue // under way before B's pull began: it ends on its own
		}
		if gap := g.Start.Sub(until); gap < quiet {
			t.Fatalf("a background request of image A (%s) began %v after %s, want lazy_fetch_quiet %v at least", g.Range, gap, what, quiet)
		}
		resumed++
	}
	if resumed == 0 {
		t.Fatalf("image A's background fetch sent no request after image B's pull began: %+v", backgroundGets(h.px, h.a))
	}
}

// backgroundGets are the GETs of l's blob through px that its pull did
// not make (pulledRange), in the order they came.
func backgroundGets(px *harness.Proxy, l *stargzLayer) []harness.BlobGet {
	return slices.DeleteFunc(px.Gets(l.digest), func(g harness.BlobGet) bool { return l.pulledRange(g.Range) })
}

func TestPullLazyCorruptChunkFailsRead(t *testing.T) {
	_, l, e, ctr := lazyPod(t, func(reg *harness.Registry, l *stargzLayer) {
		// A byte in the compressed data of a chunk of /data/big (a gzip
		// header's bytes would not change what it decompresses to).
		reg.Corrupt(l.digest, l.bigChunk)
	})

	if got := e.exec(t, ctr, "cat", "/prio.txt"); got.code != 0 || got.stdout != "prioritised\n" {
		t.Fatalf("cat /prio.txt: %+v, want the prioritised file", got)
	}
	got := e.execWithin(t, ctr, 60, "cat", "/data/big")
	if got.code == 0 || !strings.Contains(got.stderr, "Input/output error") {
		t.Fatalf("cat /data/big with a corrupt chunk: exit %d, stderr %q, want EIO", got.code, got.stderr)
	}
	if len(got.stdout) >= len(l.big) || !bytes.HasPrefix(l.big, []byte(got.stdout)) {
		t.Fatalf("cat /data/big with a corrupt chunk returned %d bytes that are not a prefix of the file", len(got.stdout))
	}
}

// A registry serving other bytes for the layer than its manifest digest
// names, whose chunks still match the TOC (another time in the gzip header
// of a chunk's member: no uncompressed byte changes), starts the container
// and serves its reads; once the layer is complete (the registry holds the
// rest back until the container runs) its blob fails the digest check: the
// layer is broken (every read fails with EIO, logged and counted), its
// image is removed, and a pull of it again fails naming the mismatch.
// Removing the pod removes the layer.
func TestPullLazyBlobDigestMismatch(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	img, l := stargzImage(t, nil)
	reg.Corrupt(l.digest, l.bigMember+4) // the member's MTIME
	gateRest(reg, l)
	p := reg.Push(t, "berth/lazy:1", img)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(reg) + metricsTOML})
	mustPull(t, d, p.Name, p.ID)
	e, ctr := runReader(t, d, reg, p.Name)
	if got := e.exec(t, ctr, "cat", "/prio.txt"); got.code != 0 || got.stdout != "prioritised\n" {
		t.Fatalf("cat /prio.txt: %+v, want the prioritised file", got)
	}
	reg.Ungate(l.digest)

	if !eventually(time.Minute, func() bool {
		broken, _ := filepath.Glob(filepath.Join(d.Root, harness.SnapshotsDir, "*", "lazy", "broken"))
		return len(broken) == 1
	}) {
		t.Fatalf("the layer whose blob does not match its digest was not marked broken; logs:\n%s", d.Logs())
	}
	if done, _ := filepath.Glob(filepath.Join(d.Root, harness.SnapshotsDir, "*", "lazy", "complete")); len(done) != 0 {
		t.Errorf("a layer that failed its digest is marked complete: %v", done)
	}
	if got := e.execWithin(t, ctr, 60, "cat", "/data/small.txt"); got.code == 0 || got.stdout != "" || !strings.Contains(got.stderr, "Input/output error") {
		t.Errorf("cat /data/small.txt of the broken layer (its chunk cached): %+v, want EIO", got)
	}
	if !strings.Contains(d.Logs(), "blob digest mismatch") {
		t.Errorf("berthd did not log the mismatch:\n%s", d.Logs())
	}
	m := scrape(t, metricsAddr(t, e))
	if m["berth_image_lazy_layer_verification_failures_total"] != 1 || m["berth_image_lazy_read_failures_total"] < 1 {
		t.Errorf("verification failures %v, read failures %v; want 1 and at least 1",
			m["berth_image_lazy_layer_verification_failures_total"], m["berth_image_lazy_read_failures_total"])
	}
	assertAbsent(t, d, p.Name, p.ID)
	_, err := pull(t, d, p.Name, nil)
	assertCode(t, err, one(codes.Internal), "blob digest mismatch")

	pod := e.listPodIDs(t, nil)[0]
	if _, err := d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if !eventually(30*time.Second, func() bool {
		return len(lazyMounts(t, d.Root)) == 0 && len(lazyFolders(t, d.Root)) == 0
	}) {
		t.Fatalf("after the pod's removal: lazy mounts %v, cache folders %v", lazyMounts(t, d.Root), lazyFolders(t, d.Root))
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

// ImageFsInfo and the image's size count what a lazy layer's cache takes
// on disk: before the registry lets the rest of the layer through, not its
// 1 MiB /data/big; once it is complete, all of it (and no more: the
// compressed bytes kept for the blob's check are gone). The slack allows
// for the TOC and the kept compressed bytes, a few KiB here. A second eStargz
// image whose layer would take the lazy layers past lazy_cache_max_bytes
// is pulled whole.
func TestPullLazyCacheFigures(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	img, l := stargzImage(t, nil)
	gateRest(reg, l)
	p := reg.Push(t, "berth/lazy:1", img)
	img2, _ := stargzImage(t, nil)
	p2 := reg.Push(t, "berth/lazy:2", img2)
	// Room for one layer with a 1 MiB file, not two.
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(reg) + "lazy_cache_max_bytes = 1572864\n"})
	used := func() uint64 { return imagesUsedBytes(t, d) }
	base := used()
	mustPull(t, d, p.Name, p.ID)
	size, fs := mustStatus(t, d, p.Name).Size, used()-base
	if m := lazyMounts(t, d.Root); len(m) != 1 {
		t.Fatalf("lazy mounts after the pull: %v, want the eStargz layer's", m)
	}

	reg.Ungate(l.digest)
	waitComplete(t, d.Root, 1)
	big, slack := uint64(len(l.big)), uint64(64<<10)
	if grew := mustStatus(t, d, p.Name).Size - size; grew < big-slack || grew > big+slack {
		t.Errorf("the image's size grew by %d bytes as its lazy layer completed, want about /data/big's %d", grew, big)
	}
	if grew := used() - base - fs; grew < big-slack || grew > big+slack {
		t.Errorf("ImageFsInfo grew by %d bytes as the lazy layer completed, want about /data/big's %d", grew, big)
	}

	mustPull(t, d, p2.Name, p2.ID)
	if m := lazyMounts(t, d.Root); len(m) != 1 {
		t.Errorf("lazy mounts after a pull past lazy_cache_max_bytes: %v, want the first image's alone", m)
	}
	if !strings.Contains(d.Logs(), "lazy_cache_max_bytes") {
		t.Errorf("berthd did not log why it pulled the second eStargz layer whole:\n%s", d.Logs())
	}
}

func TestPullLazyRegistryGone(t *testing.T) {
	reg, _, e, ctr := lazyPod(t, gateRest)

	reg.Stop()
	if got := e.exec(t, ctr, "cat", "/prio.txt"); got.code != 0 || got.stdout != "prioritised\n" {
		t.Fatalf("cat /prio.txt with the registry gone: %+v, want the fetched file", got)
	}
	got := e.execWithin(t, ctr, 60, "cat", "/data/small.txt")
	if got.code == 0 || got.stdout != "" || !strings.Contains(got.stderr, "Input/output error") {
		t.Fatalf("cat /data/small.txt with the registry gone: %+v, want EIO and nothing read", got)
	}
}

// A lazy layer server killed with berthd (a crash of both, as a node's
// reboot ends both) leaves its mounts without a server; the next berthd
// detaches them, has a new server serve the complete layer again from its
// cache (with the registry gone) and drops the incomplete one, whose image
// is then pulled again.
func TestPullLazyServerKilled(t *testing.T) {
	x := newLazyPair(t, false)
	d := x.d
	mustPull(t, d, x.second.Name, x.second.ID)

	d.Kill()
	d.KillLazyServer()
	if m := lazyMounts(t, d.Root); len(m) != 2 {
		t.Fatalf("lazy mounts after berthd and its lazy layer server were killed: %v, want the two they left", m)
	}
	x.reg.Stop()
	d.Restart()
	if m, f := lazyMounts(t, d.Root), lazyFolders(t, d.Root); len(m) != 1 || len(f) != 1 {
		t.Fatalf("after the restart: lazy mounts %v, cache folders %v; want the complete layer's alone", m, f)
	}
	mustStatus(t, d, x.first.Name)
	assertAbsent(t, d, x.second.Name)

	e, ctr := runReader(t, d, x.reg, x.first.Name)
	if got := e.exec(t, ctr, "cat", "/data/big"); got.code != 0 || got.stdout != string(x.l1.big) {
		t.Fatalf("cat /data/big from the cache after the restart: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
	}
}

// A lazy layer server that dies while berthd runs leaves mounts that fail
// every access: berthd detaches them and forgets their images (so no new
// container finds a layer empty), a later lazy pull starts a new server,
// and a restart of berthd carries on with that one.
func TestPullLazyServerDiesUnderBerthd(t *testing.T) {
	x := newLazyPair(t, false)
	d := x.d
	d.KillLazyServer()
	if !eventually(30*time.Second, func() bool { return len(lazyMounts(t, d.Root)) == 0 && imageStatus(t, d, x.first.Name) == nil }) {
		t.Fatalf("after the lazy layer server died: lazy mounts %v, first image %v; want the dead mount detached and its image forgotten",
			lazyMounts(t, d.Root), imageStatus(t, d, x.first.Name))
	}

	mustPull(t, d, x.second.Name, x.second.ID) // a new server
	servers := d.LazyServerPIDs()
	if len(servers) != 1 {
		t.Fatalf("lazy layer servers after the next lazy pull: %v, want one", servers)
	}
	d.Restart()
	if got := d.LazyServerPIDs(); !slices.Equal(got, servers) {
		t.Fatalf("lazy layer servers after the restart: %v, want %v", got, servers)
	}
	mustStatus(t, d, x.second.Name)
	mustPull(t, d, x.first.Name, x.first.ID) // pulled anew once collected
	if m := lazyMounts(t, d.Root); len(m) != 2 {
		t.Fatalf("lazy mounts after the first image was pulled again: %v, want the two layers'", m)
	}
	e, ctr := runReader(t, d, x.reg, x.second.Name)
	x.reg.Ungate(x.l2.digest)
	if got := e.execWithin(t, ctr, 60, "cat", "/data/big"); got.code != 0 || got.stdout != string(x.l2.big) {
		t.Fatalf("cat /data/big from the new server's layer: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
	}
}

// The chunks a container reads come the way the pull came: through the
// mirror, with the mirror's (bearer) credentials.
func TestPullLazyThroughAuthenticatedMirror(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	home := harness.NewRegistry(t)
	mirror := harness.NewRegistry(t, harness.WithBearerAuth("mirror", "mpw"))
	img, l := stargzImage(t, nil)
	p := mirror.Push(t, "berth/lazy:1", img) // on the mirror only
	gateRest(mirror, l)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.RegistryTOML(map[string]harness.HostConfig{
		home.Host():   {PlainHTTP: true, Mirrors: []string{mirror.URL()}},
		mirror.Host(): {PlainHTTP: true, Username: "mirror", Password: "mpw"},
	}) + "\n[image]\nlazy = true\n"})
	ref := home.Host() + "/berth/lazy:1"
	mustPull(t, d, ref, p.ID)
	e, ctr := runReader(t, d, mirror, ref)
	assertPrioritisedOnly(t, mirror, l)

	// /data/big, not a small file: a chunk next to the TOC can come with
	// the TOC's own range, and the background fetch (through the same
	// client) may be the one that brings a chunk the read waits for.
	mirror.Ungate(l.digest)
	if got := e.execWithin(t, ctr, 60, "cat", "/data/big"); got.code != 0 || got.stdout != string(l.big) {
		t.Fatalf("cat /data/big through the mirror: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
	}
	big := slices.DeleteFunc(mirror.Ranges(l.digest), func(r string) bool {
		var start, last int64
		_, err := fmt.Sscanf(r, "bytes=%d-%d", &start, &last)
		return err != nil || last < l.bigStart || start >= l.bigEnd
	})
	if len(big) == 0 {
		t.Errorf("the mirror served only %v of the layer, want /data/big's chunks, read after the start, too", mirror.Ranges(l.digest))
	}
	if r := home.Ranges(l.digest); len(r) != 0 {
		t.Errorf("the image's own registry served %v of the layer; the mirror has it", r)
	}
}

// A file another lazy layer of the node has already fetched (the same
// chunk digests) is not downloaded again: the second image's container
// reads it while the registry holds back everything but its TOC and
// prioritised files.
func TestPullLazySharesFetchedFiles(t *testing.T) {
	x := newLazyPair(t, true)
	mustPull(t, x.d, x.second.Name, x.second.ID)
	e, ctr := runReader(t, x.d, x.reg, x.second.Name)
	if got := e.exec(t, ctr, "cat", "/data/big"); got.code != 0 || got.stdout != string(x.l1.big) {
		t.Fatalf("cat /data/big, shared with the first image: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
	}
	assertPrioritisedOnly(t, x.reg, x.l2)

	// The background fetch completes the layer without the linked chunks'
	// bytes: a layer with linked chunks is verified by its chunk digests
	// and TOC, not by its whole blob.
	x.reg.Ungate(x.l2.digest)
	waitComplete(t, x.d.Root, 2)
	for _, r := range x.reg.Ranges(x.l2.digest) {
		var start, last int64
		if _, err := fmt.Sscanf(r, "bytes=%d-%d", &start, &last); err != nil || start < x.l2.bigEnd && last >= x.l2.bigStart {
			t.Errorf("the registry served %q of the second layer, whose /data/big (bytes %d-%d) is linked from the first; all: %v",
				r, x.l2.bigStart, x.l2.bigEnd-1, x.reg.Ranges(x.l2.digest))
		}
	}
	if got := e.exec(t, ctr, "sh", "-c", "cat /data/big /data/small.txt"); got.code != 0 || got.stdout != string(x.l1.big)+"not prioritised\n" {
		t.Fatalf("cat /data/big /data/small.txt of the complete layer: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
	}
}

// A user-namespaced pod's overlay takes idmapped views of its lower
// layers: the lazy layer offers them (FUSE, Linux 6.12+), and the
// container sees the layer's root-owned files as its own root's. Before
// 6.12 (the VM tier's kernel) FUSE takes no idmapped mount: the container
// is refused with FailedPrecondition naming the cause, and nothing of it is
// left.
func TestPullLazyUserNamespacePod(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	img, l := stargzImage(t, nil)
	p := reg.Push(t, "berth/lazy:1", img)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(reg), State: stateOnTmpfs(t)})
	mustPull(t, d, p.Name, p.ID)
	e := newPodEnv(t, d, reg)
	e.image = p.Name
	cfg := e.podConfig("userns")
	m := rootMapping(usernsHost, 65536)
	usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
	pod := e.runPod(t, cfg)
	if !kernelAtLeast(t, 6, 12) {
		t.Logf("Linux %s: FUSE takes idmapped mounts from 6.12 on; the container must be refused", kernelRelease(t))
		// What the pod has (its pins, its pause's bundle) before the
		// refused container, which must leave nothing of its own.
		held := func() []string {
			mounts, err := harness.MountPointsUnder(d.State, d.Root)
			if err != nil {
				t.Fatal(err)
			}
			bundles, _ := filepath.Glob(filepath.Join(d.State, "pods", pod, "containers", "*"))
			return append(mounts, bundles...)
		}
		before := held()
		cc := e.ctrConfig("reader", sleeper...)
		_, err := d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		assertCode(t, err, one(codes.FailedPrecondition), "lazily pulled", "6.12")
		if ids := e.listContainerIDs(t, nil); len(ids) != 0 {
			t.Errorf("the refused container is listed: %v", ids)
		}
		if after := held(); !slices.Equal(after, before) {
			t.Errorf("the refused container left mounts or folders: before %v, after %v", before, after)
		}
		e.removePod(t, pod)
		removeImage(t, d, p.Name)
		if !eventually(30*time.Second, func() bool { return len(lazyMounts(t, d.Root)) == 0 }) {
			t.Fatalf("lazy mounts after the image's removal: %v", lazyMounts(t, d.Root))
		}
		harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
		return
	}
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("reader", sleeper...))
	if got := e.exec(t, ctr, "stat", "-c", "%u:%g", "/data/big"); strings.TrimSpace(got.stdout) != "0:0" {
		t.Errorf("owner of /data/big in the pod's user namespace: %+v, want 0:0", got)
	}
	if got := e.exec(t, ctr, "cat", "/data/big"); got.code != 0 || got.stdout != string(l.big) {
		t.Fatalf("cat /data/big in a user-namespaced pod: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
	}
}

// A container on a lazy layer whose chunks are not fetched yet keeps
// reading correct bytes while berthd is down, stopped or killed: the lazy
// layer server (image/lazyd) serves on, fetching with the pull's source it
// holds in memory, and completes and verifies the layer meanwhile. The
// next berthd carries on with the same server; removing the image then
// ends the server and leaves no mount, process, socket or cache file.
func TestPullLazyServesWhileBerthdDown(t *testing.T) {
	for _, how := range []string{"stopped", "killed"} {
		t.Run(how, func(t *testing.T) {
			reg, l, e, ctr := lazyPod(t, gateRest)
			d := e.d
			assertPrioritisedOnly(t, reg, l) // /data/big not fetched yet
			pid := e.ctrPID(t, ctr)
			servers := d.LazyServerPIDs()
			if len(servers) != 1 {
				t.Fatalf("lazy layer servers: %v, want one", servers)
			}
			if how == "stopped" {
				d.Stop()
			} else {
				d.Kill()
			}
			if got := d.LazyServerPIDs(); !slices.Equal(got, servers) {
				t.Fatalf("lazy layer servers with berthd %s: %v, want %v still serving", how, got, servers)
			}

			// Read through the container's own root (its overlay over the
			// lazy layer) while no berthd runs.
			root := fmt.Sprintf("/proc/%d/root", pid)
			if b, err := os.ReadFile(root + "/prio.txt"); err != nil || string(b) != "prioritised\n" {
				t.Fatalf("read /prio.txt with berthd %s: %q, %v", how, b, err)
			}
			reg.Ungate(l.digest)
			if b, err := os.ReadFile(root + "/data/big"); err != nil || !bytes.Equal(b, l.big) {
				t.Fatalf("read /data/big (not fetched before) with berthd %s: %d bytes (equal: %v), %v", how, len(b), bytes.Equal(b, l.big), err)
			}
			waitComplete(t, d.Root, 1) // the background fetch and the verification went on

			d.Restart()
			if got := d.LazyServerPIDs(); !slices.Equal(got, servers) {
				t.Fatalf("lazy layer servers after the restart: %v, want %v, the one that served on", got, servers)
			}
			mustStatus(t, d, e.image)
			if got := e.exec(t, ctr, "cat", "/data/big"); got.code != 0 || got.stdout != string(l.big) {
				t.Fatalf("cat /data/big after the restart: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
			}
			removeAllLazy(t, e)
		})
	}
}

// removeAllLazy removes e's pods and its image, and checks that the lazy
// layer server then exits leaving no mount, cache folder, socket, pid
// file or snapshot.
func removeAllLazy(t *testing.T, e *podEnv) {
	t.Helper()
	d := e.d
	for _, p := range e.listPodIDs(t, nil) {
		if _, err := d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
	}
	removeImage(t, d, e.image)
	if !eventually(30*time.Second, func() bool {
		return len(lazyMounts(t, d.Root)) == 0 && len(lazyFolders(t, d.Root)) == 0 && len(d.LazyServerPIDs()) == 0
	}) {
		t.Fatalf("after removal: lazy mounts %v, cache folders %v, servers %v", lazyMounts(t, d.Root), lazyFolders(t, d.Root), d.LazyServerPIDs())
	}
	if left, _ := filepath.Glob(filepath.Join(d.State, "lazyd", "lazyd.*")); slices.ContainsFunc(left, func(p string) bool { return !strings.HasSuffix(p, ".log") }) {
		t.Errorf("lazy layer server files left: %v", left)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

// pushStargz pushes n images of stargzImage, each with its own eStargz
// layer, as berth/lazy:1 to n.
func pushStargz(t *testing.T, reg *harness.Registry, n int) ([]harness.Pushed, []*stargzLayer) {
	t.Helper()
	var pushed []harness.Pushed
	var layers []*stargzLayer
	for i := range n {
		img, l := stargzImage(t, nil)
		pushed, layers = append(pushed, reg.Push(t, fmt.Sprintf("berth/lazy:%d", i+1), img)), append(layers, l)
	}
	return pushed, layers
}

// lazy_cache_max_bytes counts the lazy layers a restarted berthd finds,
// as the berthd that pulled them did: the layer the running server still
// serves (berthd stopped), and the complete layer a new server serves
// again from its cache (berthd and its server killed). A second eStargz
// layer past the bound is pulled whole after the restart too.
func TestPullLazyCacheBoundAfterRestart(t *testing.T) {
	for _, how := range []string{"server running", "server killed"} {
		t.Run(how, func(t *testing.T) {
			harness.RequireIntegration(t)
			t.Parallel()
			reg := harness.NewRegistry(t)
			pushed, _ := pushStargz(t, reg, 2)
			p, p2 := pushed[0], pushed[1]
			// Room for one layer with a 1 MiB file, not two.
			d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(reg) + "lazy_cache_max_bytes = 1572864\n"})
			mustPull(t, d, p.Name, p.ID)
			if how == "server running" {
				d.Stop()
			} else {
				waitComplete(t, d.Root, 1) // else dropped at the restart
				d.Kill()
				d.KillLazyServer()
			}
			d.Restart()
			if m := lazyMounts(t, d.Root); len(m) != 1 {
				t.Fatalf("lazy mounts after the restart: %v, want the first image's", m)
			}

			mustPull(t, d, p2.Name, p2.ID)
			if m := lazyMounts(t, d.Root); len(m) != 1 {
				t.Errorf("lazy mounts after a pull past lazy_cache_max_bytes: %v, want the first image's alone", m)
			}
			if !strings.Contains(d.Logs(), "lazy_cache_max_bytes") {
				t.Errorf("berthd did not log why it pulled the second eStargz layer whole:\n%s", d.Logs())
			}
			removeImage(t, d, p2.Name)
			e := newPodEnv(t, d, reg)
			e.image = p.Name
			removeAllLazy(t, e)
		})
	}
}

// A lazy layer server left by a berthd of another protocol version (an
// upgrade; the fake version is a tests' build's, lazyd.ProtocolVersionEnv)
// keeps serving the layer of the container on it; the new berthd gives it
// no new layer (a second eStargz image is pulled whole), and once the old
// layer is removed that server exits and the next lazy pull starts one of
// this build.
func TestPullLazyServerOfAnotherVersion(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	pushed, layers := pushStargz(t, reg, 3)
	p1, p2, p3, l1 := pushed[0], pushed[1], pushed[2], layers[0]
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(reg),
		Env: []string{fmt.Sprintf("%s=%d", lazyd.ProtocolVersionEnv, lazyd.ProtocolVersion+1)}})
	mustPull(t, d, p1.Name, p1.ID)
	e, ctr := runReader(t, d, reg, p1.Name)
	old := d.LazyServerPIDs()
	if len(old) != 1 {
		t.Fatalf("lazy layer servers: %v, want one", old)
	}

	d.Stop()
	d.RestartEnv() // this build's berthd; the server keeps its version
	if !strings.Contains(d.Logs(), "speaks another protocol version") {
		t.Fatalf("berthd did not log the server's other protocol version (only a berthd built with the crashpoints tag fakes it):\n%s", d.Logs())
	}
	mustPull(t, d, p2.Name, p2.ID)
	if m := lazyMounts(t, d.Root); len(m) != 1 {
		t.Errorf("lazy mounts after a pull beside a server of another version: %v, want the old server's alone", m)
	}
	if got := d.LazyServerPIDs(); !slices.Equal(got, old) {
		t.Fatalf("lazy layer servers after the pull: %v, want %v alone", got, old)
	}
	if got := e.exec(t, ctr, "cat", "/data/big"); got.code != 0 || got.stdout != string(l1.big) {
		t.Fatalf("cat /data/big from the old server's layer: exit %d, %d bytes, stderr %q", got.code, len(got.stdout), got.stderr)
	}

	for _, pod := range e.listPodIDs(t, nil) {
		e.removePod(t, pod)
	}
	removeImage(t, d, p1.Name)
	if !eventually(30*time.Second, func() bool { return len(d.LazyServerPIDs()) == 0 && len(lazyMounts(t, d.Root)) == 0 }) {
		t.Fatalf("after its last layer's removal: lazy layer servers %v, mounts %v; want the old server gone", d.LazyServerPIDs(), lazyMounts(t, d.Root))
	}
	mustPull(t, d, p3.Name, p3.ID)
	if got := d.LazyServerPIDs(); len(got) != 1 || slices.Equal(got, old) {
		t.Fatalf("lazy layer servers after the next lazy pull: %v, want a new one (the old was %v)", got, old)
	}
	if m := lazyMounts(t, d.Root); len(m) != 1 {
		t.Fatalf("lazy mounts after the next lazy pull: %v, want its layer's", m)
	}
	removeImage(t, d, p2.Name)
	e.image = p3.Name
	removeAllLazy(t, e)
}
