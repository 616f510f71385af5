// Package bench holds berth's benchmarks: programs that print numbers a person
// compares between versions, not timed tests. They run only with BERTH_BENCH=1
// as root (make bench):
//
//	BERTH_BENCH=1 go test ./test/bench -run TestPullThroughput -v -count=1 -timeout 30m
package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m, "BERTH_BENCH") }

// runs is how many times each case pulls, each time into a fresh root.
const runs = 2

// TestPullThroughput pulls a large image of incompressible gzip layers from a
// loopback registry through CRI PullImage and prints seconds and MB/s, where
// MB are the compressed bytes transferred (10^6 bytes).
func TestPullThroughput(t *testing.T) {
	harness.RequireEnv(t, "BERTH_BENCH")
	cases := []struct {
		name       string
		layers     int
		layerBytes int
	}{
		{"200MB/20 layers", 20, 10_000_000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			begin := time.Now()
			img := harness.NewImage(t, harness.ImageSpec{Layers: randomLayers(c.layers, c.layerBytes)})
			var compressed int64
			for _, d := range harness.LayerDigests(t, img) {
				compressed += harness.BlobSize(t, img, d)
			}
			reg := harness.NewRegistry(t)
			p := reg.Push(t, "bench/pull:1", img)
			t.Logf("built and pushed %d layers (%d compressed bytes) in %s", c.layers, compressed, time.Since(begin).Round(time.Millisecond))

			for run := 1; run <= runs; run++ {
				t.Run(fmt.Sprint("run", run), func(t *testing.T) {
					d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host())})
					took := timePullOf(t, d, p)
					fmt.Printf("pull %s: %.2f s, %.1f MB/s (run %d of %d, fresh root)\n",
						c.name, took.Seconds(), float64(compressed)/1e6/took.Seconds(), run, runs)
					harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
				})
			}
		})
	}
}

// randomLayers makes n layers, each one file of size pseudo-random (so
// incompressible) bytes; the same every run, so that runs compare.
func randomLayers(n, size int) [][]harness.File {
	rng := rand.NewChaCha8([32]byte{'b', 'e', 'r', 't', 'h'})
	layers := make([][]harness.File, n)
	for i := range layers {
		data := make([]byte, size)
		_, _ = rng.Read(data)
		layers[i] = []harness.File{harness.Dir("data", 0o755), {Path: fmt.Sprintf("data/%02d.bin", i), Content: data}}
	}
	return layers
}

// TestPullDecoderCPU pulls an image of the host's files (compressible, as
// real layers are) with each gzip decoder and prints berthd's CPU seconds
// per MiB of gzip pulled, and the decoder berthd chooses on its defaults:
// the decoder's speed depends on the CPU (#33), so the figures are this
// machine's.
func TestPullDecoderCPU(t *testing.T) {
	harness.RequireEnv(t, "BERTH_BENCH")
	img := harness.NewImage(t, harness.ImageSpec{Layers: hostTreeLayers(t, 10, 100<<20)})
	var compressed int64
	for _, d := range harness.LayerDigests(t, img) {
		compressed += harness.BlobSize(t, img, d)
	}
	mib := float64(compressed) / (1 << 20)
	reg := harness.NewRegistry(t)
	p := reg.Push(t, "bench/hostfiles:1", img)
	for run := 1; run <= runs; run++ {
		for _, decoder := range []string{"isa-l", "builtin"} {
			t.Run(fmt.Sprintf("%s/run%d", decoder, run), func(t *testing.T) {
				d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host()) +
					fmt.Sprintf("\n[image]\ngzip_decoder = %q\n", decoder)})
				cpu := cpuSeconds(d.PID())
				took := timePullOf(t, d, p)
				fmt.Printf("pull host files (%.1f MiB gzip), %-7s decoder: %.4f CPU s per MiB, %.2f s (run %d of %d, fresh root)\n",
					mib, decoder, (cpuSeconds(d.PID())-cpu)/mib, took.Seconds(), run, runs)
			})
		}
	}
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host())})
	fmt.Printf("pull gzip decoder on berthd's defaults: %s\n", gzipChoice(d.Logs()))
}

// timePullOf pulls the pushed image p into d and checks its image_ref.
func timePullOf(t *testing.T, d *harness.Daemon, p harness.Pushed) time.Duration {
	t.Helper()
	start := time.Now()
	resp, err := d.Images.PullImage(t.Context(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: p.Name}})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	if resp.ImageRef != p.ID {
		t.Fatalf("image_ref %s, want %s", resp.ImageRef, p.ID)
	}
	return took
}

// gzipChoice is berthd's log line about its gzip decoder, less the log's
// own fields.
func gzipChoice(logs string) string {
	for line := range strings.Lines(logs) {
		if i := strings.Index(line, `msg="gzip layers: `); i >= 0 {
			return strings.TrimSpace(line[i:])
		}
	}
	return "not logged"
}
