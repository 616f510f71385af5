package integration

import (
	"bytes"
	"compress/gzip"
	"io"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berth-runtime/berth/test/harness"
)

// TestPullInflatesWithISAL: berthd told to inflate gzip layers with ISA-L
// does so on a node that has libisal2 (test/deps.sh installs it), and a
// layer made of two gzip members, as parallel compressors (pigz) write
// them, unpacks whole: a file spans the members' border.
func TestPullInflatesWithISAL(t *testing.T) {
	t.Parallel()
	reg, d := start(t, "\n[image]\ngzip_decoder = \"isa-l\"\n")
	if !strings.Contains(d.Logs(), `msg="gzip layers: isa-l decoder" component=image decoder=isa-l why=configured`) {
		t.Fatalf("berthd did not say it inflates with ISA-L; its log:\n%s", d.Logs())
	}

	words := strings.Fields("usr lib share ELF locale init config return error main")
	rng := rand.New(rand.NewPCG(1, 2))
	var text strings.Builder
	for text.Len() < 3<<20 {
		text.WriteString(words[rng.IntN(len(words))] + " ")
	}
	tarStream := harness.TarBytes(t, []harness.File{harness.Reg("spans", text.String(), 0o644), harness.Reg("after", "after", 0o644)})
	half := len(tarStream) / 2
	compressed := append(gzipped(t, tarStream[:half]), gzipped(t, tarStream[half:])...)
	layer, err := tarballLayerOf(compressed)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(harness.BusyboxImage(t, harness.ImageSpec{}), layer)
	if err != nil {
		t.Fatal(err)
	}
	p := reg.Push(t, "berth/members:1", img)
	mustPull(t, d, p.Name, p.ID)
	if got := snapshotFile(t, d.Root, "spans"); !bytes.Equal(got, []byte(text.String())) {
		t.Fatalf("the file across the gzip members unpacked to %d bytes, want %d, or differs", len(got), text.Len())
	}
	if got := snapshotFile(t, d.Root, "after"); string(got) != "after" {
		t.Fatalf("the second member's file = %q", got)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestGzipDecoderChosenByMeasurement: on its defaults berthd measures both
// gzip decoders on this CPU at start (ISA-L loads here) and says which it
// chose and why, in its log and in berthctl info.
func TestGzipDecoderChosenByMeasurement(t *testing.T) {
	t.Parallel()
	_, d := start(t, "")
	if !regexp.MustCompile(`msg="gzip layers: (isa-l|builtin) decoder" component=image decoder=(isa-l|builtin) why="measured on this CPU: inflating and hashing a 1024 KiB sample took [0-9.]+(µs|ms|s) with ISA-L, [0-9.]+(µs|ms|s) with the builtin decoder"`).MatchString(d.Logs()) {
		t.Fatalf("berthd did not log the measured choice of gzip decoder; its log:\n%s", d.Logs())
	}
	out, err := d.Berthctl("info")
	if err != nil {
		t.Fatalf("berthctl info: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^gzip decoder: +(isa-l|builtin) \(measured on this CPU: .* with ISA-L, .* with the builtin decoder\)$`).MatchString(out) {
		t.Fatalf("berthctl info does not show the measured gzip decoder:\n%s", out)
	}
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// tarballLayerOf makes a layer of an already compressed blob, kept as it is.
func tarballLayerOf(compressed []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(compressed)), nil })
}
