package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-runtime/berth/cri/atomicfile"
	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/opencontainers/go-digest"
)

// ErrVerification is wrapped by the error of a layer whose whole blob, once
// fetched, does not match the digest its manifest gives it, or whose
// content does not match the diff ID its image config gives it: its chunks
// matched its TOC, but the TOC does not describe the image's layer.
var ErrVerification = errors.New("lazy layer failed verification")

// Files of a layer not verified yet.
const (
	rawDir     = "raw"    // the compressed bytes fetched so far, one file per request, named START-END
	brokenFile = "broken" // the layer failed its verification; holds why
	linkedFile = "linked" // a chunk was linked from another layer's cache (a partial pull)
)

// writeCached writes a file of the cache whole (cri/atomicfile): the
// cache's files are trusted by name, so a name only ever holds all of its
// bytes. A crash can leave a temp file (a dot file), which the listings of
// chunks and kept pieces skip: no name parses as one. Nothing is synced: a
// read that misses the cache writes its chunks before it answers, and a
// sync each would put the disk's flush on the container's read.
func writeCached(path string, b []byte) error {
	return atomicfile.Write(path, b, 0o600)
}

// keepRaw keeps the compressed bytes of span, which a request fetched, for
// the verification of the whole blob once the layer is complete.
func keepRaw(dir string, span registry.Span, b []byte) error {
	return writeCached(filepath.Join(dir, rawDir, fmt.Sprintf("%d-%d", span.Start, span.End)), b)
}

// keepRaw keeps the bytes of span in the layer's folder, counting them.
func (l *Layer) keepRaw(span registry.Span, b []byte) error {
	if err := keepRaw(l.dir, span, b); err != nil {
		return err
	}
	l.disk.Add(int64(len(b)))
	return nil
}

// rawPiece is one kept request's bytes: where they are in the blob.
type rawPiece struct {
	span registry.Span
	path string
}

// rawPieces lists the kept pieces of the blob, by start.
func (l *Layer) rawPieces() ([]rawPiece, error) {
	names, err := os.ReadDir(filepath.Join(l.dir, rawDir))
	if err != nil {
		return nil, err
	}
	var out []rawPiece
	for _, n := range names {
		start, end, ok := strings.Cut(n.Name(), "-")
		s, err1 := strconv.ParseInt(start, 10, 64)
		e, err2 := strconv.ParseInt(end, 10, 64)
		if ok && err1 == nil && err2 == nil {
			out = append(out, rawPiece{registry.Span{Start: s, End: e}, filepath.Join(l.dir, rawDir, n.Name())})
		}
	}
	slices.SortFunc(out, func(a, b rawPiece) int { return int(a.span.Start - b.span.Start) })
	return out, nil
}

// gaps are the spans of the blob no kept piece holds (the gzip members
// before the first chunk), in runs of up to groupBytes.
func gaps(pieces []rawPiece, size int64) []registry.Span {
	var out []registry.Span
	pos := int64(0)
	add := func(end int64) {
		for ; pos < end; pos = min(pos+groupBytes, end) {
			out = append(out, registry.Span{Start: pos, End: min(pos+groupBytes, end)})
		}
	}
	for _, p := range pieces {
		add(p.span.Start)
		pos = max(pos, p.span.End)
	}
	add(size)
	return out
}

// fetchGaps fetches and keeps what the blob's verification needs beyond
// what reads and the background fetched.
func (l *Layer) fetchGaps(ctx context.Context) error {
	pieces, err := l.rawPieces()
	if err != nil {
		return err
	}
	for _, span := range gaps(pieces, l.blob.Size) {
		if err := l.opts.Fetches.acquire(ctx); err != nil {
			return err
		}
		b, err := fetch(ctx, l.src, l.blob, span, l.opts.StallTimeout)
		l.opts.Fetches.release()
		if err == nil {
			err = l.keepRaw(span, b)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// verifyBlob checks the kept pieces, in blob order, against the blob's
// digest and, uncompressed, against its diff ID (when the image gave one).
func (l *Layer) verifyBlob() error {
	pieces, err := l.rawPieces()
	if err != nil {
		return err
	}
	if g := gaps(pieces, l.blob.Size); len(g) != 0 {
		return fmt.Errorf("blob %s: %s not fetched", l.blob.Digest, g[0].RangeHeader())
	}
	var parts []io.Reader
	pos := int64(0)
	for _, p := range pieces {
		if p.span.End <= pos {
			continue // a chunk a read and the background both fetched
		}
		f, err := os.Open(p.path)
		if err != nil {
			return err
		}
		defer f.Close()
		parts = append(parts, io.NewSectionReader(f, pos-p.span.Start, p.span.End-pos))
		pos = p.span.End
	}
	blobHash := digest.Canonical.Digester()
	compressed := io.TeeReader(io.MultiReader(parts...), blobHash.Hash())
	diffHash := digest.Canonical.Digester()
	zr, err := l.opts.Inflate(compressed)
	if err == nil {
		_, err = io.Copy(diffHash.Hash(), zr)
		zr.Close()
	}
	if err != nil {
		return fmt.Errorf("%w: blob %s does not inflate: %v", ErrVerification, l.blob.Digest, err)
	}
	if _, err := io.Copy(io.Discard, compressed); err != nil {
		return err
	}
	if got := blobHash.Digest(); got != l.blob.Digest {
		return fmt.Errorf("%w: blob digest mismatch: the manifest names %s, the registry served %s", ErrVerification, l.blob.Digest, got)
	}
	if got := diffHash.Digest(); l.blob.DiffID != "" && got != l.blob.DiffID {
		return fmt.Errorf("%w: blob %s: diff ID mismatch: the image config names %s, the layer is %s", ErrVerification, l.blob.Digest, l.blob.DiffID, got)
	}
	return nil
}

// finish verifies the complete layer and marks it complete, dropping the
// kept compressed bytes, or broken: then every read of it fails.
func (l *Layer) finish() {
	// A layer with chunks linked from another layer's cache (a partial
	// pull) is not checked against its blob digest and diff ID: that check
	// needs every compressed byte, and would download again the linked
	// chunks the partial pull saved. Each of its chunks was checked
	// against its digest in the TOC, and the TOC against the manifest's
	// annotation (Load), the manifest being content-addressed: the chain
	// of trust stargz-snapshotter relies on too.
	checked := "chunk digests and TOC only; blob digest and diff ID not checked: chunks were linked from another layer"
	var err error
	if !l.linked() {
		checked = "blob digest and diff ID"
		err = l.fetchGaps(l.ctx)
		if err == nil {
			err = l.verifyBlob()
		}
	}
	switch {
	case l.ctx.Err() != nil:
	case errors.Is(err, ErrVerification):
		l.markBroken(err)
	case err != nil:
		l.opts.Log.Warn("lazy layer: could not verify the complete layer; reads keep working, its image is pulled again after a restart", "blob", l.blob.Digest, "err", err)
	default:
		crashpoint.Hit("lazy fetch", "layer verified")
		// The kept bytes go first: a complete layer never holds them.
		os.RemoveAll(filepath.Join(l.dir, rawDir))
		l.disk.Store(diskBytes(l.dir))
		crashpoint.Hit("lazy fetch", "kept bytes dropped")
		if err := os.WriteFile(filepath.Join(l.dir, completeFile), nil, 0o600); err != nil {
			l.opts.Log.Warn("lazy layer: mark complete", "blob", l.blob.Digest, "err", err)
			return
		}
		l.opts.Log.Info("lazy layer complete", "blob", l.blob.Digest, "verified", checked)
	}
}

// linked says whether a chunk of the layer was linked from another
// layer's cache (reuseChunk).
func (l *Layer) linked() bool {
	_, err := os.Stat(filepath.Join(l.dir, linkedFile))
	return err == nil
}

// markBroken fails every later read of the layer with err, and tells the
// layer's owner (Options.Broken).
func (l *Layer) markBroken(err error) {
	l.mu.Lock()
	l.broken = err
	l.mu.Unlock()
	if werr := os.WriteFile(filepath.Join(l.dir, brokenFile), []byte(err.Error()), 0o600); werr != nil {
		l.opts.Log.Warn("lazy layer: mark broken", "blob", l.blob.Digest, "err", werr)
	}
	l.opts.Log.Error("lazy layer: reads fail with EIO from now on", "blob", l.blob.Digest, "err", err)
	l.opts.Broken(err)
}

// Broken returns why the layer in dir failed its verification, nil if it
// did not.
func Broken(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, brokenFile))
	if err != nil {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrVerification, strings.TrimPrefix(string(b), ErrVerification.Error()+": "))
}
