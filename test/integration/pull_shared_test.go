package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
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

// TestPullRetriesFailedSharedLayer (#34, finding 3): a pull that waits on
// another pull's unpack of the same layer (the same blob, from another
// registry) fetches it itself when that unpack fails, rather than fail
// with the other pull's error.
func TestPullRetriesFailedSharedLayer(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	bad, good := harness.NewRegistry(t), harness.NewRegistry(t)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(bad.Host(), good.Host())})
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	pb, pg := bad.Push(t, "berth/shared:1", img), good.Push(t, "berth/shared:1", img)
	layer := baseLayer(t, img)
	bad.Stall(layer, harness.BlobSize(t, img, layer)/2)

	cancelBad, badDone := pullInBackground(t, d, pb.Name)
	waitFetching(t, bad, layer)
	_, goodDone := pullInBackground(t, d, pg.Name)
	// The good pull joins the bad one's unpack (berthd says so in its log).
	if !eventually(30*time.Second, func() bool {
		return strings.Contains(d.Logs(), "waiting for another pull's unpack of a layer")
	}) {
		t.Fatal("the second pull never waited on the first one's unpack of the layer they share")
	}
	cancelBad() // the shared unpack fails: its only other caller gave up
	if err := <-badDone; err == nil {
		t.Fatal("the stalled pull succeeded")
	}
	if err := <-goodDone; err != nil {
		t.Fatalf("the pull that waited on the failed unpack: %v", err)
	}
	mustStatus(t, d, pg.Name)
	if n := good.Fetches(layer); n != 1 {
		t.Errorf("the good registry was asked for the layer %d times, want 1", n)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}
