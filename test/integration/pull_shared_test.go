package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// pullInBackground starts a pull of ref that the test can cancel; its
// result comes on the channel.
func pullInBackground(t *testing.T, d *harness.Daemon, ref string) (context.CancelFunc, <-chan error) {
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() {
		_, err := d.Images.PullImage(c, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		done <- err
	}()
	return cancel, done
}

// waitFetching waits until reg has been asked for blob d.
func waitFetching(t *testing.T, reg *harness.Registry, d v1.Hash) {
	t.Helper()
	if !eventually(30*time.Second, func() bool { return reg.Fetches(d) > 0 }) {
		t.Fatalf("the registry was never asked for %s", d)
	}
}

// TestPullNotHeldByHostileSharedLayer (#34, finding 3): a hostile image
// whose config names a popular image's diff IDs, with a blob of its own
// that trickles in (and is not that layer), must not hold a pull of the
// popular image, nor make it fail with its diff ID mismatch. The popular
// pull must end while the hostile one is still trickling, well within its
// own pull_progress_timeout.
func TestPullNotHeldByHostileSharedLayer(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const timeout = 20 * time.Second
	reg, d := start(t, harness.ImageTOML(timeout.String()))
	popular := harness.BusyboxImage(t, harness.ImageSpec{})
	pp := reg.Push(t, "berth/popular:1", popular)
	cf, err := popular.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	noise := make([]byte, 32<<10)
	rand.Read(noise)
	hostile := harness.NewImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("evil", hex.EncodeToString(noise), 0o644)}}})
	ph := reg.PushWithConfig(t, "berth/hostile:1", hostile, func(h *v1.ConfigFile) { h.RootFS.DiffIDs = cf.RootFS.DiffIDs })
	evil := harness.LayerDigests(t, hostile)[0]
	// 32 bytes every 100 ms: minutes for the whole blob, never a stall.
	reg.Trickle(evil, 32, 100*time.Millisecond)

	cancelHostile, hostileDone := pullInBackground(t, d, ph.Name)
	waitFetching(t, reg, evil)

	if _, err := pullWithin(t, d, pp.Name, nil, timeout); err != nil {
		t.Fatalf("the popular image's pull, while a hostile image claiming its layer trickles in: %v", err)
	}
	select {
	case err := <-hostileDone:
		t.Fatalf("the hostile pull ended (%v) before the popular one: the popular pull did not finish on its own", err)
	default:
	}
	mustStatus(t, d, pp.Name)

	cancelHostile()
	if err := <-hostileDone; err == nil {
		t.Error("the hostile pull succeeded after its client gave up")
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, popular))
}

// TestPullNotHeldByTricklingSource (#34/3): a registry that serves the
// real bytes of a popular layer slowly (never a stall) must not hold a
// pull of the same layer from another registry: that pull neither waits
// on the trickling pull's unpack nor on its partial download, and ends
// while the trickle goes on. Cancelled, the trickling pull leaves nothing:
// no private file, and no partial download of a layer that is on disk.
func TestPullNotHeldByTricklingSource(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const timeout = 20 * time.Second
	slow, honest := harness.NewRegistry(t), harness.NewRegistry(t)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(slow.Host(), honest.Host()) + harness.ImageTOML(timeout.String())})
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	ps, ph := slow.Push(t, "berth/shared:1", img), honest.Push(t, "berth/shared:1", img)
	layer := baseLayer(t, img)
	// 32 bytes every 100 ms: minutes for the layer, never a stall.
	slow.Trickle(layer, 32, 100*time.Millisecond)

	cancelSlow, slowDone := pullInBackground(t, d, ps.Name)
	waitFetching(t, slow, layer)
	if _, err := pullWithin(t, d, ph.Name, nil, timeout); err != nil {
		t.Fatalf("the pull from the honest registry, while another trickles the same layer: %v", err)
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the trickling pull ended (%v) before the honest one: the honest pull did not finish on its own", err)
	default:
	}
	mustStatus(t, d, ph.Name)
	if n := honest.Fetches(layer); n != 1 {
		t.Errorf("the honest registry was asked for the layer %d times, want 1", n)
	}

	cancelSlow()
	if err := <-slowDone; err == nil {
		t.Error("the trickling pull succeeded after its client gave up")
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
	assertNoPartialDownloads(t, d)
}

// assertNoPartialDownloads checks that no partial download is kept (in
// time: the cancelled pull removes its own as it ends).
func assertNoPartialDownloads(t *testing.T, d *harness.Daemon) {
	t.Helper()
	dir := filepath.Join(d.Root, harness.IngestDir, harness.ResumableDir)
	var left []os.DirEntry
	if !eventually(10*time.Second, func() bool {
		left, _ = os.ReadDir(dir)
		return len(left) == 0
	}) {
		t.Errorf("partial downloads kept of a layer on disk: %v", left)
	}
}

// TestPullRetriesSharedLayerAfterItsPullEnded (#34, finding 3): a pull
// that waits on another pull's unpack of the same layer (the same blob,
// from the same repository) fetches it itself when that unpack fails
// because its pull gave up, rather than fail with the other pull's error;
// it resumes the download that pull left.
func TestPullRetriesSharedLayerAfterItsPullEnded(t *testing.T) {
	reg, d := start(t, "")
	t.Parallel()
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	// Two tags: two pulls (the same reference would be one shared pull).
	first, second := reg.Push(t, "berth/shared:1", img), reg.Push(t, "berth/shared:2", img)
	layer := baseLayer(t, img)
	reg.Stall(layer, harness.BlobSize(t, img, layer)/2)

	cancelFirst, firstDone, secondDone := pullsSharingLayer(t, d, reg, layer, first.Name, second.Name)
	reg.Heal(layer)
	cancelFirst() // the shared unpack fails: its pull gave up
	if err := <-firstDone; err == nil {
		t.Fatal("the stalled pull succeeded")
	}
	assertWaiterPulledItself(t, d, reg, img, second.Name, secondDone) // the stalled GET, and the rest of it
	// The rest, not the whole blob again: its GET asks for a range past 0.
	if r := reg.Ranges(layer); len(r) != 2 || r[0] != "" || !strings.HasPrefix(r[1], "bytes=") || strings.HasPrefix(r[1], "bytes=0-") {
		t.Errorf("the layer's GETs asked for %q, want the whole blob and then a range resuming past its start", r)
	}
}

// TestPullSharedLayerBlobFailureNotRetried (#34/3): when a shared unpack
// fails for what the blob is (here its diff ID), the pulls that waited on
// it fail with that error too: each fetching the blob again from the same
// repository would get the same bytes, once per waiter.
func TestPullSharedLayerBlobFailureNotRetried(t *testing.T) {
	reg, d := start(t, "")
	t.Parallel()
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	wrong := func(c *v1.ConfigFile) {
		c.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	}
	first, second := reg.PushWithConfig(t, "berth/wrong:1", img, wrong), reg.PushWithConfig(t, "berth/wrong:2", img, wrong)
	layer := baseLayer(t, img)
	reg.Trickle(layer, 32, 100*time.Millisecond) // until the second pull joins

	_, firstDone, secondDone := pullsSharingLayer(t, d, reg, layer, first.Name, second.Name)
	reg.Heal(layer)
	for _, done := range []<-chan error{firstDone, secondDone} {
		if err := <-done; err == nil || !strings.Contains(err.Error(), "diff ID mismatch") {
			t.Errorf("a pull of a layer with a wrong diff ID ended with %v, want its diff ID mismatch", err)
		}
	}
	if n := reg.Fetches(layer); n != 1 {
		t.Errorf("the registry was asked for the layer %d times, want 1: the waiter fetched a blob the shared unpack refused", n)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t))
}

// TestPullSharedLayerOwnFailureRetried (#34/3): when a shared unpack fails
// for a reason of its pull's own, not the blob's (here the registry
// refuses that pull's GET of the layer, as it would its credentials), the
// pull that waited on it fetches the layer itself and succeeds, rather
// than fail with the other pull's error.
func TestPullSharedLayerOwnFailureRetried(t *testing.T) {
	reg, d := start(t, "")
	t.Parallel()
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	first, second := reg.Push(t, "berth/shared:1", img), reg.Push(t, "berth/shared:2", img)
	layer := baseLayer(t, img)
	reg.HoldThenFail(layer, http.StatusForbidden) // the first pull's GET, once the second joined

	_, firstDone, secondDone := pullsSharingLayer(t, d, reg, layer, first.Name, second.Name)
	reg.Heal(layer)
	if err := <-firstDone; err == nil || !strings.Contains(err.Error(), "DENIED") {
		t.Errorf("the pull whose GET of the layer was refused ended with %v, want the registry's refusal", err)
	}
	assertWaiterPulledItself(t, d, reg, img, second.Name, secondDone) // the refused GET, and the waiter's own
}

// pullsSharingLayer starts a pull of first, waits until it fetches layer,
// then starts a pull of second and waits until it waits on the first
// one's unpack of layer. It returns the first pull's cancel and both
// pulls' results.
func pullsSharingLayer(t *testing.T, d *harness.Daemon, reg *harness.Registry, layer v1.Hash, first, second string) (context.CancelFunc, <-chan error, <-chan error) {
	t.Helper()
	cancelFirst, firstDone := pullInBackground(t, d, first)
	waitFetching(t, reg, layer)
	_, secondDone := pullInBackground(t, d, second)
	waitJoined(t, d)
	return cancelFirst, firstDone, secondDone
}

// assertWaiterPulledItself checks that the pull of img as name, which
// waited on another pull's unpack of img's layer that failed, pulled it
// itself: it succeeded, and the registry was asked for the layer twice
// (the failed pull's GET and the waiter's own).
func assertWaiterPulledItself(t *testing.T, d *harness.Daemon, reg *harness.Registry, img v1.Image, name string, done <-chan error) {
	t.Helper()
	if err := <-done; err != nil {
		t.Fatalf("the pull that waited on another pull's failed unpack of the layer: %v", err)
	}
	mustStatus(t, d, name)
	if n := reg.Fetches(baseLayer(t, img)); n != 2 {
		t.Errorf("the registry was asked for the layer %d times, want 2 (the failed pull's GET, and the waiter's own)", n)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// waitJoined waits until a pull waits on another's unpack of a layer
// (berthd says so in its log).
func waitJoined(t *testing.T, d *harness.Daemon) {
	t.Helper()
	if !eventually(30*time.Second, func() bool {
		return strings.Contains(d.Logs(), "waiting for another pull's unpack of a layer")
	}) {
		t.Fatal("the second pull never waited on the first one's unpack of the layer they share")
	}
}

// TestPullWaitingOnSlotWaiterNotStalled (#34/3): with one download slot
// on the node, a pull waiting for a blob's partial file, held by another
// pull's download (same source) that itself waits for the slot, is not
// stalled by that wait: the holder's excused wait is its waiters' too.
// Both pulls end once the slot is free.
func TestPullWaitingOnSlotWaiterNotStalled(t *testing.T) {
	const timeout = 2 * time.Second
	reg, d := start(t, fmt.Sprintf("[image]\nmax_concurrent_downloads = 1\npull_progress_timeout = %q\n", timeout))
	t.Parallel()
	layerImage := func(file string) v1.Image {
		noise := make([]byte, 32<<10)
		rand.Read(noise)
		return harness.NewImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg(file, hex.EncodeToString(noise), 0o644)}}})
	}
	hog, base, alone := layerImage("hog"), layerImage("base"), layerImage("shared")
	shared, err := alone.Layers()
	if err != nil {
		t.Fatal(err)
	}
	// The shared blob under another chain ID: each pull downloads it
	// itself, the second waiting for the first's partial file.
	stacked, err := mutate.AppendLayers(base, shared[0])
	if err != nil {
		t.Fatal(err)
	}
	ph, pb := reg.Push(t, "berth/hog:1", hog), reg.Push(t, "berth/base:1", base)
	pa, ps := reg.Push(t, "berth/shared:1", alone), reg.Push(t, "berth/shared:2", stacked)
	mustPull(t, d, pb.Name, pb.ID)
	hogLayer, sharedLayer := baseLayer(t, hog), baseLayer(t, alone)
	reg.Trickle(hogLayer, 32, 100*time.Millisecond) // holds the slot, never stalls

	_, hogDone := pullInBackground(t, d, ph.Name)
	waitFetching(t, reg, hogLayer)
	_, aloneDone := pullInBackground(t, d, pa.Name)
	if !eventually(30*time.Second, func() bool { return strings.Contains(d.Logs(), "waiting for a download slot") }) {
		t.Fatal("the pull of the shared layer never waited for the download slot")
	}
	_, stackedDone := pullInBackground(t, d, ps.Name)
	// The holder's excused wait moves its clock, and the waiter follows it.
	if !eventually(30*time.Second, func() bool { return strings.Contains(d.Logs(), "following another pull's download of a blob") }) {
		t.Fatal("the pull of the shared layer under another chain ID never followed the download holding its partial file")
	}
	// That the waiter is not cancelled shows only in time passing: its
	// progress watch cancels a pull that moved nothing for the progress
	// timeout, looking every timeout/8. Three timeouts from when it was
	// seen waiting are past where a waiter that took the holder's slot
	// wait for a stall would have been cancelled; a slower machine only
	// sees more of the wait, never a cancel that did not happen.
	select {
	case err := <-stackedDone:
		t.Fatalf("the pull waiting for the shared partial file ended (%v) while its holder waited for the slot", err)
	case <-time.After(3 * timeout):
	}
	reg.Heal(hogLayer)
	for name, done := range map[string]<-chan error{ph.Name: hogDone, pa.Name: aloneDone, ps.Name: stackedDone} {
		if err := <-done; err != nil {
			t.Errorf("pull %s: %v", name, err)
		}
	}
	if n := reg.Fetches(sharedLayer); n != 2 {
		t.Errorf("the shared layer was fetched %d times, want 2 (once per chain ID)", n)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, hog, base, alone, stacked))
}
