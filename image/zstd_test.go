package image

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image/gunzip"
)

// zstdStream encodes content with the given window: the frame header
// declares it, as content is larger than one block.
func zstdStream(t *testing.T, content []byte, window int) []byte {
	t.Helper()
	var buf bytes.Buffer
	e, err := zstd.NewWriter(&buf, zstd.WithWindowSize(window), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Write(content); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	var h zstd.Header
	if err := h.Decode(buf.Bytes()); err != nil || h.WindowSize != uint64(window) {
		t.Fatalf("the stream's header declares a window of %d (%v), want %d", h.WindowSize, err, window)
	}
	return buf.Bytes()
}

// TestZstdWindowBounded: a zstd layer whose frames declare a window over
// maxZstdWindow is refused from its frame header, before the decoder holds
// the window in memory, with ErrZstdWindow (FailedPrecondition) naming the
// bound (#21); windows up to the bound decode.
func TestZstdWindowBounded(t *testing.T) {
	content := make([]byte, 1<<20)
	for i := range content {
		content[i] = byte(i / 4096)
	}
	// A frame declaring 256 MiB of content in one segment: its window is its
	// content size (magic, single segment with an 8-byte size, an empty last raw block).
	singleSegment := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0x01, 0, 0}
	for _, c := range []struct {
		name   string
		stream []byte
		want   []byte // nil: refused with ErrZstdWindow
	}{
		{"encoder default", zstdStream(t, content, 8<<20), content},
		{"at the bound", zstdStream(t, content, maxZstdWindow), content},
		{"over the bound", zstdStream(t, content, 2*maxZstdWindow), nil},
		{"one segment of 256 MiB", singleSegment, nil},
		{"second frame over the bound", append(zstdStream(t, content, 8<<20), zstdStream(t, content, 2*maxZstdWindow)...), nil},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			r, err := decompress(bufio.NewReader(bytes.NewReader(c.stream)), gunzip.Decoder{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			r.Close()
			runtime.ReadMemStats(&after)
			if c.want != nil {
				if err != nil || !bytes.Equal(got, c.want) {
					t.Fatalf("decompress = %d bytes, %v; want the %d bytes encoded", len(got), err, len(c.want))
				}
				return
			}
			if !errors.Is(err, ErrZstdWindow) || !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "32 MiB") {
				t.Fatalf("decompress = %v; want ErrZstdWindow naming the 32 MiB bound", err)
			}
			if len(got) > len(content) {
				t.Errorf("%d bytes decoded from the frame over the bound", len(got)-len(content))
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > maxZstdWindow {
				t.Errorf("refusing the frame allocated %d MiB", n>>20)
			}
		})
	}
}
