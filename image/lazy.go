package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/lazy"
	"github.com/berth-runtime/berth/image/snapshot"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/semaphore"
)

// defaultLazyFetches bounds the background requests of lazy layers when
// Options.LazyFetches is not set.
const defaultLazyFetches = 4

// lazyKey is the snapshot key of a lazy layer: its chain ID with its blob.
// A lazy layer's diff ID is only checked once all of it is fetched, and
// not at all for a partial pull (chunks linked from another layer), so it
// never stands for a chain ID alone, which other images' fully unpacked
// (and verified) layers are shared under.
func lazyKey(chainID string, blob v1.Hash) string {
	return lazyKeyPrefix + chainID + " " + blob.String()
}

const lazyKeyPrefix = "lazy "

func isLazyKey(key string) bool { return strings.HasPrefix(key, lazyKeyPrefix) }

// lazyBlob says whether the layer desc (of diff ID diffID) is pulled
// lazily: lazy pulls are on, the pull has a registry, and the descriptor
// announces an eStargz TOC digest, which is what makes its chunk digests
// trustworthy.
func (s *Service) lazyBlob(src layerSource, desc v1.Descriptor, diffID digest.Digest) (lazy.Blob, bool) {
	toc, err := digest.Parse(desc.Annotations[lazy.TOCDigestAnnotation])
	if !s.opts.Lazy || src.lazy == nil || err != nil {
		return lazy.Blob{}, false
	}
	return lazy.Blob{Digest: digest.Digest(desc.Digest.String()), Size: desc.Size, TOCDigest: toc, DiffID: diffID}, true
}

// checkFUSE refuses [image] lazy on a node without FUSE.
func checkFUSE() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("[image] lazy = true needs FUSE: %w", err)
	}
	return f.Close()
}

// lazyDir is the folder of a lazy layer's TOC and cache, beside the
// snapshot's fs folder (its mount point).
func lazyDir(fsDir string) string { return filepath.Join(filepath.Dir(fsDir), "lazy") }

// ensureLazyLayer makes sure the lazy snapshot key exists and is mounted:
// it fetches the layer's TOC and prioritised files into a new snapshot,
// mounts it and adds it to later, whose background fetch of the rest the
// pull starts once its layers are in.
func (s *Service) ensureLazyLayer(ctx context.Context, key string, blob lazy.Blob, src lazy.Source, slots *semaphore.Weighted, later *laterFetches) (err error) {
	if snap, ok, err := s.snaps.Get(key); ok || err != nil {
		if err != nil {
			return err
		}
		// A layer that failed its verification stays while containers
		// use it; a pull of it fails as a whole pull of its blob would.
		if err := lazy.Broken(lazyDir(s.snaps.Dir(snap))); err != nil {
			return err
		}
		s.metrics.layer("reused")
		return nil
	}
	if err := slots.Acquire(ctx, 1); err != nil {
		return err
	}
	defer slots.Release(1)
	dir, abort, err := s.prepareSnapshot()
	if err != nil {
		return err
	}
	defer func() { abort(err) }()
	size, inodes, err := lazy.Prepare(ctx, lazyDir(dir), src, blob, lazy.Options{Log: s.log, Find: s.findChunk})
	if err != nil {
		return fmt.Errorf("lazy layer %s: %w", blob.Digest, err)
	}
	if err := s.reserveLazy(key, size); err != nil {
		return fmt.Errorf("lazy layer %s: %w", blob.Digest, err)
	}
	snap, err := s.snaps.Commit(key, dir, size, inodes)
	if errors.Is(err, snapshot.ErrExists) {
		s.metrics.layer("reused")
		s.snaps.Abort(dir)
		return nil
	}
	if err == nil {
		crashpoint.Hit("pull", "lazy layer stored")
		s.metrics.layer("lazy")
		var l *lazy.Layer
		if l, err = s.mountLazy(snap, src); err != nil {
			err = errors.Join(err, s.snaps.Remove(key))
		} else {
			later.add(l)
		}
	}
	if err != nil {
		s.releaseLazy(key)
	}
	return err
}

// reserveLazy counts the lazy layer key of full size size against
// [image] lazy_cache_max_bytes, or, past it, refuses it with ErrNotLazy:
// the layer is then pulled whole. The bound counts every lazy layer at its
// full size, what its cache holds once complete, so that the caches
// together never grow past it however much the containers read.
func (s *Service) reserveLazy(key string, size int64) error {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	if _, ok := s.lazySizes[key]; ok {
		return nil // a concurrent pull of the same layer
	}
	var total int64
	for _, n := range s.lazySizes {
		total += n
	}
	if bound := s.opts.LazyCacheMaxBytes; bound > 0 && total+size > bound {
		return fmt.Errorf("%w: its %d bytes would take the lazy layers to %d bytes, past [image] lazy_cache_max_bytes %d",
			lazy.ErrNotLazy, size, total+size, bound)
	}
	s.lazySizes[key] = size
	return nil
}

// releaseLazy stops counting the lazy layer key against the bound.
func (s *Service) releaseLazy(key string) {
	s.lazyMu.Lock()
	delete(s.lazySizes, key)
	s.lazyMu.Unlock()
}

// diskSize is what a snapshot takes on disk: a lazy layer's cache so far,
// another layer's unpacked size.
func (s *Service) diskSize(snap snapshot.Snapshot) int64 {
	s.lazyMu.Lock()
	l := s.lazyLayers[snap.ChainID]
	s.lazyMu.Unlock()
	if l != nil {
		return l.DiskBytes()
	}
	return snap.Size
}

// sizeLazy sets the size of img, which has lazy layers, from what their
// caches take now: the kubelet's image GC weighs images by it.
func (s *Service) sizeLazy(img *Image) {
	if !slices.ContainsFunc(img.ChainIDs, isLazyKey) {
		return
	}
	var size uint64
	for _, key := range img.ChainIDs {
		snap, ok, err := s.snaps.Get(key)
		if err != nil || !ok {
			return // being removed: the stored size stands
		}
		size += uint64(s.diskSize(snap))
	}
	img.Size = size
}

// mountLazy serves a lazy snapshot at its fs folder.
func (s *Service) mountLazy(snap snapshot.Snapshot, src lazy.Source) (*lazy.Layer, error) {
	fsDir := s.snaps.Dir(snap)
	l, err := lazy.Load(lazyDir(fsDir), src, lazy.Options{Log: s.log, StallTimeout: s.opts.ProgressTimeout,
		ReadFailed: s.metrics.lazyReadFailed, Find: s.findChunk, Broken: func(error) { s.forgetImagesOf(snap.ChainID) },
		Inflate: s.gzip.NewReader})
	if err != nil {
		return nil, err
	}
	if err := l.Mount(fsDir); err != nil {
		return nil, fmt.Errorf("mount lazy layer %s: %w", snap.ChainID, err)
	}
	s.lazyMu.Lock()
	s.lazyLayers[snap.ChainID] = l
	s.lazySizes[snap.ChainID] = l.FullSize()
	s.lazyMu.Unlock()
	return l, nil
}

// laterFetches are the lazy layers a pull mounted, whose background
// fetch of the rest waits until the pull's layers are all in (or it
// failed): started at mount, it took the link, the disk and the CPU from
// the prioritised files of the layers after it (issue #40's profile).
type laterFetches struct {
	mu     sync.Mutex
	layers []*lazy.Layer
}

func (f *laterFetches) add(l *lazy.Layer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.layers = append(f.layers, l)
}

// start starts the background fetch of each layer added, sharing slots.
func (f *laterFetches) start(slots *semaphore.Weighted) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.layers {
		l.Complete(slots)
	}
	f.layers = nil
}

// restoreLazy serves again the lazy layers a stopped berthd left: the
// complete ones from their cache. An incomplete one is dropped (its
// images with it, pulled again on demand): the registry credentials of
// its pull are not kept, so nothing could fetch the rest.
func (s *Service) restoreLazy() error {
	snaps, err := s.snaps.List()
	if err != nil {
		return err
	}
	var errs []error
	for _, snap := range snaps {
		dir := lazyDir(s.snaps.Dir(snap))
		switch {
		case !lazy.IsLayer(dir):
		case lazy.IsComplete(dir):
			_, err := s.mountLazy(snap, nil)
			errs = append(errs, err)
		default:
			s.log.Warn("dropping a lazy layer berthd stopped before it was complete; its images are pulled again", "layer", snap.ChainID)
			errs = append(errs, s.snaps.Remove(snap.ChainID))
		}
	}
	return errors.Join(errs...)
}

// forgetImagesOf removes the images whose layers include the snapshot
// key, which failed its verification: the kubelet pulls them again, and
// that pull fails naming the mismatch (ensureLazyLayer) until the
// snapshot is collected once no container uses it. Counted as a pull
// failure would be.
func (s *Service) forgetImagesOf(key string) {
	s.metrics.lazyLayerBroken()
	err := s.images.update(s.opts.DB, func(tx *bolt.Tx) error {
		for _, img := range s.images.all(func(img *Image) bool { return slices.Contains(img.ChainIDs, key) }) {
			s.log.Warn("forgetting an image whose lazy layer failed its verification", "image", img.ID, "layer", key)
			if err := s.images.delete(tx, img.ID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("forget the images of a lazy layer that failed its verification", "layer", key, "err", err)
	}
	s.requestGC()
}

// removeSnapshot unmounts a lazy snapshot, then removes it. One still in
// use stays for the next collection.
func (s *Service) removeSnapshot(key string) error {
	s.lazyMu.Lock()
	l := s.lazyLayers[key]
	s.lazyMu.Unlock()
	if l != nil {
		if err := l.Close(); err != nil {
			return fmt.Errorf("unmount lazy layer %s: %w", key, err)
		}
		s.lazyMu.Lock()
		delete(s.lazyLayers, key)
		delete(s.lazySizes, key)
		s.lazyMu.Unlock()
	}
	return s.snaps.Remove(key)
}

// closeLazy stops the background fetches and unmounts the lazy layers.
// The layers are closed outside lazyMu: a read being served may be
// looking for a chunk in the others (findChunk).
func (s *Service) closeLazy() {
	s.lazyMu.Lock()
	layers := s.lazyLayers
	s.lazyLayers = map[string]*lazy.Layer{}
	s.lazyMu.Unlock()
	for key, l := range layers {
		if err := l.Close(); err != nil {
			s.log.Warn("unmount lazy layer at shutdown", "layer", key, "err", err)
		}
	}
}

// findChunk names a cached chunk of digest d in one of the mounted lazy
// layers: what a partial pull links rather than fetches.
func (s *Service) findChunk(d digest.Digest) (string, bool) {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	for _, l := range s.lazyLayers {
		if p, ok := l.CachedChunk(d); ok {
			return p, true
		}
	}
	return "", false
}
