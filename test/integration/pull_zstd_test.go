package integration

import (
	"bytes"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc/codes"

	"github.com/berth-runtime/berth/test/harness"
)

// zstdRawFrame wraps payload in one zstd frame of raw (stored) blocks whose
// header declares a window of 1<<windowLog bytes: a valid stream that any
// decoder allowing that window turns back into payload.
func zstdRawFrame(payload []byte, windowLog byte) []byte {
	const maxBlock = 128 << 10
	// Magic; a frame header with no content size, checksum or dictionary; the window.
	out := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, (windowLog - 10) << 3}
	for {
		n := min(len(payload), maxBlock)
		last := n == len(payload)
		hdr := uint32(n) << 3 // block type 0: raw
		if last {
			hdr |= 1
		}
		out = append(out, byte(hdr), byte(hdr>>8), byte(hdr>>16))
		out = append(out, payload[:n]...)
		if payload = payload[n:]; last {
			return out
		}
	}
}

// zstdBlobLayer is a layer whose blob is the given zstd stream of tarball.
type zstdBlobLayer struct{ blob, tarball []byte }

func (l zstdBlobLayer) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(l.blob))
	return h, err
}
func (l zstdBlobLayer) DiffID() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(l.tarball))
	return h, err
}
func (l zstdBlobLayer) Size() (int64, error)                { return int64(len(l.blob)), nil }
func (l zstdBlobLayer) MediaType() (types.MediaType, error) { return types.OCILayerZStd, nil }
func (l zstdBlobLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}
func (l zstdBlobLayer) Uncompressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.tarball)), nil
}

// TestPullRefusesWideZstdWindow: a zstd layer whose frame declares a 256 MiB
// window, which the decoder would hold in berthd's memory, fails the pull
// with FailedPrecondition naming the layer and the 32 MiB bound, and leaves
// nothing (#21). The same layer framed with an 8 MiB window, on the image's
// ordinary zstd base layer, pulls.
func TestPullRefusesWideZstdWindow(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	base := harness.BusyboxImage(t, harness.ImageSpec{Compression: harness.Zstd})
	tarball := harness.TarBytes(t, []harness.File{harness.Reg("framed", "a layer in raw zstd blocks", 0o644)})
	image := func(windowLog byte) v1.Image {
		img, err := mutate.AppendLayers(base, zstdBlobLayer{blob: zstdRawFrame(tarball, windowLog), tarball: tarball})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	wide := reg.Push(t, "berth/zstd:wide", image(28))
	diffID, _, err := v1.SHA256(bytes.NewReader(tarball))
	if err != nil {
		t.Fatal(err)
	}

	_, err = pull(t, d, wide.Name, nil)
	assertCode(t, err, []codes.Code{codes.FailedPrecondition}, "zstd window too large", "32 MiB", diffID.String())
	assertAbsent(t, d, wide.Name, wide.ID)
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))

	img := image(23)
	mustPull(t, d, reg.Push(t, "berth/zstd:8mib", img).Name, harness.ConfigDigest(t, img))
	if got := snapshotFile(t, d.Root, "framed"); string(got) != "a layer in raw zstd blocks" {
		t.Errorf("framed = %q", got)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}
