package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/gunzip"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/berth-runtime/berth/image/unpack"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
)

// parallelLayers bounds the layers one pull fetches and unpacks at once.
const parallelLayers = 4

// maxConfigSize bounds an image config: real ones are kilobytes (history and
// labels included), and each is decoded whenever its image is read.
const maxConfigSize = 4 << 20

// layerOpener returns a layer's uncompressed tar stream and a check to run
// once the stream has been read to its end.
type layerOpener func(context.Context, v1.Layer) (io.ReadCloser, func() error, error)

// store unpacks img's layers into snapshots and records the image under n.
// The config is kept in the content store, and so are the manifests and
// indexes in keep. (A docker-save tarball has no manifest worth keeping:
// go-containerregistry would compress every layer to compute one.)
//
// A failed store leaves nothing behind: layers it committed before the
// failure are collected (in the background) unless another image uses them.
func (s *Service) store(ctx context.Context, img v1.Image, n names, keep [][]byte, open layerOpener, watch *progressWatch) (*Image, error) {
	rec, err := s.storeHeld(ctx, img, n, keep, open, watch)
	if err != nil {
		s.requestGC()
	}
	return rec, err
}

// storeHeld holds the image's layers and blobs from the moment it knows them
// until its image record references them.
func (s *Service) storeHeld(ctx context.Context, img v1.Image, n names, keep [][]byte, open layerOpener, watch *progressWatch) (*Image, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if size := m.Config.Size; size < 0 || size > maxConfigSize {
		return nil, fmt.Errorf("config %s: its descriptor says %d bytes, more than the %d an image config may have", m.Config.Digest, size, maxConfigSize)
	}
	cfgRaw, err := img.RawConfigFile() // the fetch reads no more than the descriptor's size
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	id := digest.FromBytes(cfgRaw)
	if id.String() != cfgName.String() {
		return nil, fmt.Errorf("config: digest mismatch: manifest names %s, content is %s", cfgName, id)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	cfg, chainIDs, err := decodeConfig(cfgRaw, len(layers))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", id, err)
	}
	blobs := []string{id.String()}
	for _, b := range keep {
		blobs = append(blobs, digest.FromBytes(b).String())
	}
	defer s.hold(append(blobs, chainIDs...)...)()

	// Every layer waits in its own goroutine, in order, for one of the
	// slots; a layer gives its slot back once its stream is verified, so the
	// next one downloads and unpacks while this one's commit waits for its
	// files to reach the disk.
	slots := semaphore.NewWeighted(parallelLayers)
	g, gctx := errgroup.WithContext(ctx)
	for i, l := range layers {
		g.Go(func() error { return s.ensureLayer(gctx, l, chainIDs[i], cfg.RootFS.DiffIDs[i], open, slots, watch) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	rec := &Image{ID: id.String(), Config: cfg, ChainIDs: chainIDs, Created: time.Now().UTC()}
	if err := s.content.Put(id, cfgRaw); err != nil {
		return nil, err
	}
	crashpoint.Hit("pull", "config stored")
	for _, b := range keep {
		d := digest.FromBytes(b)
		if err := s.content.Put(d, b); err != nil {
			return nil, err
		}
		rec.Manifests = union(rec.Manifests, []string{d.String()})
	}
	for _, c := range chainIDs {
		snap, _, err := s.snaps.Get(c)
		if err != nil {
			return nil, err
		}
		rec.Size += uint64(snap.Size)
	}
	err = s.images.update(s.opts.DB, func(tx *bolt.Tx) (err error) {
		rec, err = s.images.record(tx, rec, n)
		return err
	})
	if err == nil {
		crashpoint.Hit("pull", "image recorded")
	}
	return rec, err
}

// decodeConfig decodes an image config for an image of the given number of
// layers and returns it with the chain IDs of its layers. Diff IDs must be
// sha256 digests: that is what unpacking checks them against.
func decodeConfig(raw []byte, layers int) (ocispec.Image, []string, error) {
	var cfg ocispec.Image
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return cfg, nil, err
	}
	if layers != len(cfg.RootFS.DiffIDs) {
		return cfg, nil, fmt.Errorf("%d layers but %d diff IDs", layers, len(cfg.RootFS.DiffIDs))
	}
	for i, d := range cfg.RootFS.DiffIDs {
		if err := d.Validate(); err != nil || d.Algorithm() != digest.SHA256 {
			return cfg, nil, fmt.Errorf("diff ID %d %q is not a sha256 digest", i, d)
		}
	}
	return cfg, chainIDs(cfg.RootFS.DiffIDs), nil
}

// ensureLayer makes sure the snapshot chainID exists, unpacking l if not.
// Concurrent callers for one chain ID share one unpack: the first does it,
// the others wait for its result (and pause their own progress watch, since
// the first pull's watch covers the transfer).
func (s *Service) ensureLayer(ctx context.Context, l v1.Layer, chainID string, diffID digest.Digest, open layerOpener, slots *semaphore.Weighted, watch *progressWatch) error {
	if _, ok, err := s.snaps.Get(chainID); ok || err != nil {
		if ok {
			s.metrics.layer("reused")
		}
		return err
	}
	s.inflightMu.Lock()
	if f, ok := s.inflight[chainID]; ok {
		s.inflightMu.Unlock()
		if watch != nil {
			watch.waiting.Add(1)
			defer watch.waiting.Add(-1)
		}
		<-f.done
		if f.err == nil {
			s.metrics.layer("reused")
		}
		return f.err
	}
	f := &layerFlight{done: make(chan struct{})}
	s.inflight[chainID] = f
	s.inflightMu.Unlock()

	f.err = s.unpackLayer(ctx, l, chainID, diffID, open, slots)
	if f.err == nil {
		s.metrics.layer("unpacked")
	}
	s.inflightMu.Lock()
	delete(s.inflight, chainID)
	s.inflightMu.Unlock()
	close(f.done)
	return f.err
}

// layerFlight is one unpack in progress; err is set before done closes.
type layerFlight struct {
	done chan struct{}
	err  error
}

// unpackLayer fetches and unpacks l into a new snapshot while it holds one
// of the slots, and commits the snapshot once it gave the slot back.
func (s *Service) unpackLayer(ctx context.Context, l v1.Layer, chainID string, diffID digest.Digest, open layerOpener, slots *semaphore.Weighted) (err error) {
	if err := slots.Acquire(ctx, 1); err != nil {
		return err
	}
	releaseSlot := sync.OnceFunc(func() { slots.Release(1) })
	defer releaseSlot()
	start := time.Now()
	rc, check, err := open(ctx, l)
	if err != nil {
		return fmt.Errorf("layer %s: %w", diffID, err)
	}
	closeStream := sync.OnceValue(rc.Close)
	defer closeStream()
	dir, err := s.snaps.Prepare()
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.snaps.Abort(dir)
		}
	}()
	var stream io.Reader = rc
	if s.opts.MaxLayerBytes > 0 {
		stream = unpack.Bound(rc, s.opts.MaxLayerBytes)
	}
	h := sha256.New()
	tee := io.TeeReader(stream, h)
	stats, err := unpack.Unpack(ctx, tee, dir, unpack.Options{MaxBytes: s.opts.MaxLayerBytes, MaxEntries: s.opts.MaxLayerEntries})
	if err == nil {
		_, err = io.Copy(io.Discard, tee) // the tar's padding still counts for the diff ID
	}
	if err == nil {
		err = check()
	}
	if errors.Is(err, unpack.ErrTooLarge) {
		return fmt.Errorf("layer %s: %w (bounded by [image] max_layer_bytes and max_layer_entries in berthd's config)", diffID, err)
	}
	if err != nil {
		return fmt.Errorf("layer %s: %w", diffID, err)
	}
	if got := digest.NewDigest(digest.SHA256, h); got != diffID {
		return fmt.Errorf("layer %s: uncompressed content has digest %s (diff ID mismatch)", diffID, got)
	}
	// The blob is verified and unpacked: its download file goes now, before
	// the flush after the commit (image/snapshot) would write it out only to
	// delete it after.
	closeStream()
	releaseSlot()
	unpacked := time.Now()
	if _, err := s.snaps.Commit(chainID, dir, stats.Bytes, stats.Inodes); err != nil {
		return err
	}
	crashpoint.Hit("pull", "layer stored")
	s.log.Debug("unpacked layer", "diffID", diffID, "bytes", stats.Bytes, "inodes", stats.Inodes,
		"unpack", unpacked.Sub(start), "commit", time.Since(unpacked))
	return nil
}

// remoteLayers opens the layers of a pull from blobs: each downloads into
// its partial file, resuming where an earlier attempt stopped
// (download.go), and streams through the decompressor its first bytes call
// for (gzip, zstd or none).
func (s *Service) remoteLayers(blobs *registry.Blobs, watch *progressWatch) layerOpener {
	return func(ctx context.Context, l v1.Layer) (io.ReadCloser, func() error, error) {
		d, err := l.Digest()
		if err != nil {
			return nil, nil, err
		}
		size, err := l.Size()
		if err != nil {
			return nil, nil, err
		}
		rc, err := s.fetchBlob(ctx, blobs, digest.Digest(d.String()), size, watch)
		if err != nil {
			return nil, nil, err
		}
		return decompressed(rc, s.gzip)
	}
}

// decompressed reads a compressed layer blob whose stream ends with its
// digest check: a mismatch is the error of the read that reaches the end,
// which the check makes happen.
func decompressed(rc io.ReadCloser, gz gunzip.Decoder) (io.ReadCloser, func() error, error) {
	br := bufio.NewReaderSize(rc, 1<<20)
	un, err := decompress(br, gz)
	if err != nil {
		rc.Close()
		return nil, nil, err
	}
	check := func() error {
		_, err := io.Copy(io.Discard, br) // trailing bytes after the stream, and the digest check
		return err
	}
	return closers{un, rc}, check, nil
}

// openLocalLayer reads layers of an imported image, whose files the caller
// named: the diff ID check is what verifies them.
func openLocalLayer(_ context.Context, l v1.Layer) (io.ReadCloser, func() error, error) {
	rc, err := l.Uncompressed()
	return rc, func() error { return nil }, err
}

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

func decompress(br *bufio.Reader, gz gunzip.Decoder) (io.ReadCloser, error) {
	head, err := br.Peek(4)
	if len(head) == 0 && errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("empty layer: %w", err)
	}
	if len(head) == 0 && err != nil {
		return nil, err // the download's
	}
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		return gz.NewReader(br)
	case bytes.HasPrefix(head, zstdMagic):
		// MaxMemory bounds the window of a "single segment" frame, which is
		// its whole content; MaxWindow that of every other frame.
		d, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderMaxMemory(maxZstdWindow))
		if err != nil {
			return nil, err
		}
		return zstdLayer{d}, nil
	default:
		return io.NopCloser(br), nil
	}
}

// maxZstdWindow bounds the window of a zstd layer's frames: the history
// its decoder holds in memory, up to 512 MiB by the library's default, in
// berthd (which the OOM killer spares) and for each layer pulled at once.
// Image builders (containerd, BuildKit, buildah) encode with at most 8 MiB,
// as the zstd tool does at levels up to 19; 32 MiB leaves room for
// "--ultra -20" and refuses only --long and levels 21-22 (64-128 MiB).
const maxZstdWindow = 32 << 20

// zstdLayer turns the decoder's refusal of a frame's window into
// ErrZstdWindow, naming the bound. The refusal comes from each frame's
// header, before the window is allocated.
type zstdLayer struct{ d *zstd.Decoder }

func (z zstdLayer) Read(p []byte) (int, error) {
	n, err := z.d.Read(p)
	if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		err = fmt.Errorf("%w: a frame needs more than the %d MiB berth decompresses zstd with (%v)", ErrZstdWindow, maxZstdWindow>>20, err)
	}
	return n, err
}

func (z zstdLayer) Close() error {
	z.d.Close()
	return nil
}

// closers reads from the first and closes all.
type closers []io.ReadCloser

func (c closers) Read(p []byte) (int, error) { return c[0].Read(p) }
func (c closers) Close() error {
	for _, rc := range c {
		rc.Close()
	}
	return nil
}

// chainIDs computes the OCI chain IDs of a stack of diff IDs.
func chainIDs(diffIDs []digest.Digest) []string {
	out := make([]string, len(diffIDs))
	var prev digest.Digest
	for i, d := range diffIDs {
		if i == 0 {
			prev = d
		} else {
			prev = digest.FromString(prev.String() + " " + d.String())
		}
		out[i] = prev.String()
	}
	return out
}
