package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// rangeBenchRate (bytes/s, MiB) is what the proxy lets through each connection: a
// registry or CDN that limits each connection, as many do.
const rangeBenchRate = 25 << 20

// TestPullRanges pulls an image of one large layer through a proxy that
// limits each connection's bandwidth, with ranges (the default) and with
// one download allowed, and prints the seconds each took; then it cuts a
// pull half way and prints what the retry transferred.
func TestPullRanges(t *testing.T) {
	harness.RequireEnv(t, "BERTH_BENCH")
	const size = 128_000_000
	img := harness.NewImage(t, harness.ImageSpec{Compression: harness.Uncompressed, Layers: randomLayers(1, size)})
	layer := harness.LayerDigests(t, img)[0]
	blob := harness.BlobSize(t, img, layer)
	reg := harness.NewRegistry(t)
	px := harness.NewProxy(t, reg)
	reg.Push(t, "bench/big:1", img)
	ref := px.Host() + "/bench/big:1"
	name := fmt.Sprintf("%dMB single layer, %dMiB/s per connection", blob/1e6, rangeBenchRate>>20)

	pullOnce := func(t *testing.T, toml string) (time.Duration, error) {
		d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(px.Host()) + toml})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		_, err := d.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		return time.Since(start), err
	}
	for _, c := range []struct{ how, toml string }{
		{"ranges", ""},
		{"one connection", "[image]\nmax_concurrent_downloads = 1\n"},
	} {
		t.Run(c.how, func(t *testing.T) {
			px.LimitRate(rangeBenchRate)
			px.Reset()
			took, err := pullOnce(t, c.toml)
			if err != nil {
				t.Fatalf("pull: %v", err)
			}
			fmt.Printf("pull %s, %s: %.2f s, %.1f MB/s, %d connections for the layer, %d at once\n",
				name, c.how, took.Seconds(), float64(blob)/1e6/took.Seconds(), len(px.Gets(layer)), px.MaxInFlight())
		})
	}
	t.Run("resume", func(t *testing.T) {
		px.LimitRate(0)
		px.Reset()
		px.CutOnce(layer, blob/2)
		// One connection, so that the cut falls in the middle of the body.
		if _, err := pullOnce(t, "[image]\nmax_concurrent_downloads = 1\n"); err != nil {
			t.Fatalf("pull: %v", err)
		}
		fmt.Printf("pull %s, cut at 50%%: %d of %d bytes transferred (%.2f of the layer) in %d requests\n",
			name, px.Sent(layer), blob, float64(px.Sent(layer))/float64(blob), len(px.Gets(layer)))
	})
}
