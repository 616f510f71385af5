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
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/content"
	"github.com/berth-runtime/berth/image/gunzip"
	"github.com/berth-runtime/berth/image/lazy"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/berth-runtime/berth/image/snapshot"
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

// layerSource opens the layers of one store.
type layerSource struct {
	// open returns a layer's uncompressed tar stream and a check to run
	// once the stream has been read to its end.
	open func(context.Context, v1.Layer) (io.ReadCloser, func() error, error)
	// blob names the content open reads for a layer: its source (the
	// endpoint's host and repository) and its blob's digest. Pulls that
	// read the same blob from the same source share one unpack of it; a
	// pull from another source never waits on it (a registry serving the
	// blob slowly holds only its own pulls). Nil: never shared (an
	// import's files, whose compressed digest is not at hand).
	blob func(v1.Layer) (string, error)
	// digest is a layer's blob digest; nil where blob is.
	digest func(v1.Layer) (digest.Digest, error)
	// lazy fetches byte ranges of eStargz layers that are pulled lazily
	// (lazy.go); nil: every layer is unpacked whole.
	lazy lazy.Source
	// lazySource is where lazy fetches from, for the lazy layer server.
	lazySource *registry.BlobSource
}

// store unpacks img's layers into snapshots and records the image under n.
// The config is kept in the content store, and so are the manifests and
// indexes in keep. (A docker-save tarball has no manifest worth keeping:
// go-containerregistry would compress every layer to compute one.)
//
// A failed store leaves nothing behind: layers it committed before the
// failure are collected (in the background) unless another image uses them.
// One that ran out of space has the partial downloads no pull is writing
// removed too.
func (s *Service) store(ctx context.Context, img v1.Image, n names, keep [][]byte, src layerSource, watch *progressWatch) (*Image, error) {
	rec, err := s.storeHeld(ctx, img, n, keep, src, watch)
	switch {
	case errors.Is(err, syscall.ENOSPC):
		s.requestGCFreeingPartials()
	case err != nil:
		s.requestGC()
	}
	return rec, err
}

// mergeAnnotations adds the annotations of a manifest or index (raw JSON,
// already verified against its digest) to a; a blob without them adds none.
func mergeAnnotations(a map[string]string, raw []byte) map[string]string {
	var m struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return a
	}
	return mergeMaps(a, m.Annotations)
}

// storeHeld holds the image's layers and blobs from the moment it knows them
// until its image record references them.
func (s *Service) storeHeld(ctx context.Context, img v1.Image, n names, keep [][]byte, src layerSource, watch *progressWatch) (*Image, error) {
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
	keys := slices.Clone(chainIDs) // the snapshots: a lazy layer's has its own key
	lazyBlobs := make([]lazy.Blob, len(layers))
	for i := range keys {
		if b, ok := s.lazyBlob(src, m.Layers[i], cfg.RootFS.DiffIDs[i]); ok {
			keys[i], lazyBlobs[i] = lazyKey(chainIDs[i], m.Layers[i].Digest), b
		}
	}
	defer s.hold(append(blobs, append(keys, chainIDs...)...)...)()

	// Every layer waits in its own goroutine, in order, for one of the
	// slots; a layer gives its slot back once its stream is verified, so the
	// next one downloads and unpacks while this one's commit waits for its
	// files to reach the disk.
	slots := semaphore.NewWeighted(parallelLayers)
	later := new(laterFetches)
	g, gctx := errgroup.WithContext(ctx)
	for i, l := range layers {
		g.Go(func() error {
			if keys[i] != chainIDs[i] {
				err := s.ensureLazyLayer(gctx, keys[i], lazyBlobs[i], src, slots, later)
				if !errors.Is(err, lazy.ErrNotLazy) {
					return err
				}
				s.log.Info("pulling an eStargz layer whole", "layer", m.Layers[i].Digest, "why", err)
				keys[i] = chainIDs[i]
			}
			return s.ensureLayer(gctx, l, chainIDs[i], cfg.RootFS.DiffIDs[i], src, slots, watch)
		})
	}
	err = g.Wait()
	s.startFetches(later)
	if err != nil {
		return nil, err
	}

	rec := &Image{ID: id.String(), Config: cfg, ChainIDs: keys, Created: time.Now().UTC()}
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
		rec.Annotations = mergeAnnotations(rec.Annotations, b)
	}
	for _, c := range keys {
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
// Concurrent pulls that fetch the same blob from the same source for one
// chain ID share one unpack: the first does it, the others wait for it
// (waitShared). A pull whose blob or source differs (another registry's
// copy, a registry that trickles a popular blob, or a hostile image that
// names this layer's diff IDs) never waits on it: each unpacks its own,
// and the first to pass its diff ID check is kept. When the shared unpack
// fails for what the blob is (blobFailure: its digest, its diff ID, its
// size), its waiters fail with it: the same bytes would fail them too.
// Any other failure was the unpacking pull's own (cancelled or stalled,
// its credentials refused, a registry error after its retries, a full
// disk): its waiters then fetch the blob themselves, with their own
// credentials and context, rather than take another pull's error.
func (s *Service) ensureLayer(ctx context.Context, l v1.Layer, chainID string, diffID digest.Digest, src layerSource, slots *semaphore.Weighted, watch *progressWatch) error {
	key := ""
	if src.blob != nil {
		blob, err := src.blob(l)
		if err != nil {
			return err
		}
		key = chainID + " " + blob
	}
	for {
		if _, ok, err := s.snaps.Get(chainID); ok || err != nil {
			if ok {
				s.metrics.layer("reused")
			}
			return err
		}
		if key == "" {
			return s.unpackOwn(ctx, l, chainID, diffID, src, slots)
		}
		f, first := s.joinLayer(key, watch)
		if first {
			return s.runLayerFlight(ctx, f, key, l, chainID, diffID, src, slots)
		}
		s.log.Debug("waiting for another pull's unpack of a layer", "layer", diffID)
		if err := waitShared(ctx, f, watch); err != nil {
			return err
		}
		if f.err == nil {
			s.metrics.layer("reused")
			return nil
		}
		if blobFailure(f.err) {
			return f.err
		}
		s.log.Info("another pull's unpack of a shared layer failed; this pull fetches it itself", "layer", diffID, "err", f.err)
	}
}

// errDiffIDMismatch is returned (wrapped) for a layer whose uncompressed
// content is not what the image config's diff ID names.
var errDiffIDMismatch = errors.New("diff ID mismatch")

// blobFailure says err was decided by the blob itself (its digest, its diff
// ID, its size): any pull fetching the same blob from the same source gets
// it too, so pulls sharing its unpack share it. Every other failure (a
// cancelled or stalled pull, refused credentials, a registry error, a full
// disk) belongs to the pull that met it.
func blobFailure(err error) bool {
	return errors.Is(err, errBlobDigestMismatch) || errors.Is(err, errDiffIDMismatch) || errors.Is(err, unpack.ErrTooLarge)
}

// layerFlight is one unpack in progress; err is set before done closes.
type layerFlight struct {
	done chan struct{}
	err  error
	// progress is the progress clock of the pull doing the unpack (its
	// watch's last): its bytes, and its waits for slots that its own watch
	// excuses, such as this unpack's wait for one of its pull's slots.
	progress *atomic.Int64
}

// joinLayer returns the unpack in progress for key, or starts one (first)
// for the pull watched by watch.
func (s *Service) joinLayer(key string, watch *progressWatch) (f *layerFlight, first bool) {
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	if f, ok := s.inflight[key]; ok {
		return f, false
	}
	f = &layerFlight{done: make(chan struct{}), progress: &watch.last}
	s.inflight[key] = f
	return f, true
}

// runLayerFlight unpacks the layer for the pulls that joined f.
func (s *Service) runLayerFlight(ctx context.Context, f *layerFlight, key string, l v1.Layer, chainID string, diffID digest.Digest, src layerSource, slots *semaphore.Weighted) error {
	f.err = s.unpackOwn(ctx, l, chainID, diffID, src, slots)
	s.inflightMu.Lock()
	delete(s.inflight, key)
	s.inflightMu.Unlock()
	close(f.done)
	return f.err
}

// unpackOwn unpacks l from this pull's own source. The snapshot of another pull that
// unpacked the same layer from another blob and committed first is kept,
// and this one dropped.
func (s *Service) unpackOwn(ctx context.Context, l v1.Layer, chainID string, diffID digest.Digest, src layerSource, slots *semaphore.Weighted) error {
	err := s.unpackLayer(ctx, l, chainID, diffID, src, slots)
	switch {
	case errors.Is(err, snapshot.ErrExists):
		s.metrics.layer("reused")
		return nil
	case err == nil:
		s.metrics.layer("unpacked")
	default:
		s.dropUselessPartial(l, chainID, src)
	}
	return err
}

// dropUselessPartial deletes the partial download of l's blob, which a
// failed unpack kept for its next attempt, when another pull committed the
// layer meanwhile (from another source, while this one trickled): no
// attempt will resume it.
func (s *Service) dropUselessPartial(l v1.Layer, chainID string, src layerSource) {
	if src.digest == nil {
		return
	}
	if _, ok, err := s.snaps.Get(chainID); !ok || err != nil {
		return
	}
	d, err := src.digest(l)
	if err == nil {
		err = s.content.DropPartial(d)
	}
	if err != nil {
		s.log.Warn("removing the partial download of a layer on disk", "layer", chainID, "err", err)
	}
}

// waitShared waits for f, another pull's unpack of a layer this pull
// needs, until it ends or this pull's own context does. That pull's
// progress counts as this one's: a stall of it (by the same
// pull_progress_timeout) cancels it and fails f, and this pull then
// fetches the layer itself.
func waitShared(ctx context.Context, f *layerFlight, watch *progressWatch) error {
	return content.Follow(ctx, f.done, f.progress, watch.touch)
}

// unpackLayer fetches and unpacks l into a new snapshot while it holds one
// of the slots, and commits the snapshot once it gave the slot back.
func (s *Service) unpackLayer(ctx context.Context, l v1.Layer, chainID string, diffID digest.Digest, src layerSource, slots *semaphore.Weighted) (err error) {
	if err := slots.Acquire(ctx, 1); err != nil {
		return err
	}
	releaseSlot := sync.OnceFunc(func() { slots.Release(1) })
	defer releaseSlot()
	start := time.Now()
	rc, check, err := src.open(ctx, l)
	if err != nil {
		return layerError(diffID, err)
	}
	closeStream := sync.OnceValue(rc.Close)
	defer closeStream()
	dir, abort, err := s.prepareSnapshot()
	if err != nil {
		return err
	}
	defer func() { abort(err) }()
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
	if err != nil {
		return layerError(diffID, err)
	}
	if got := digest.NewDigest(digest.SHA256, h); got != diffID {
		return fmt.Errorf("layer %s: uncompressed content has digest %s (%w)", diffID, got, errDiffIDMismatch)
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

// prepareSnapshot makes a folder to fill and commit, and returns it with
// its rollback: abort(err) discards the folder when err is not nil.
func (s *Service) prepareSnapshot() (dir string, abort func(error), err error) {
	dir, err = s.snaps.Prepare()
	if err != nil {
		return "", nil, err
	}
	return dir, func(err error) {
		if err != nil {
			s.snaps.Abort(dir)
		}
	}, nil
}

// layerError names the layer in err, and the bounds when it is too large.
func layerError(diffID digest.Digest, err error) error {
	if errors.Is(err, unpack.ErrTooLarge) {
		return fmt.Errorf("layer %s: %w (bounded by [image] max_layer_bytes and max_layer_entries in berthd's config)", diffID, err)
	}
	return fmt.Errorf("layer %s: %w", diffID, err)
}

// remoteLayers opens the layers of a pull from blobs: each downloads into
// its partial file, resuming where an earlier attempt stopped
// (download.go), and streams through the decompressor its first bytes call
// for (gzip, zstd or none).
func (s *Service) remoteLayers(blobs *registry.Blobs, where *registry.BlobSource, watch *progressWatch) layerSource {
	blobDigest := func(l v1.Layer) (digest.Digest, error) {
		d, err := l.Digest() // the manifest's descriptor: nothing is fetched
		return digest.Digest(d.String()), err
	}
	open := func(ctx context.Context, l v1.Layer) (io.ReadCloser, func() error, error) {
		d, err := blobDigest(l)
		if err != nil {
			return nil, nil, err
		}
		size, err := l.Size()
		if err != nil {
			return nil, nil, err
		}
		rc, err := s.fetchBlob(ctx, blobs, d, size, watch)
		if err != nil {
			return nil, nil, err
		}
		return decompressed(rc, s.gzip)
	}
	blob := func(l v1.Layer) (string, error) {
		d, err := blobDigest(l)
		return blobs.Source() + "@" + d.String(), err
	}
	src := layerSource{open: open, blob: blob, digest: blobDigest}
	if s.opts.Lazy {
		src.lazy, src.lazySource = blobs, where
	}
	return src
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

// localLayers reads the layers of an imported image, whose files the
// caller named: the diff ID check is what verifies them.
var localLayers = layerSource{open: openLocalLayer}

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
