package image

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/lazy"
	"github.com/berth-runtime/berth/image/lazyd"
	"github.com/berth-runtime/berth/image/registry"
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
	if !s.opts.Lazy || src.lazy == nil || err != nil || s.lazyServerForeign() {
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

// ensureLazyLayer makes sure the lazy snapshot key exists and is served:
// it fetches the layer's TOC and prioritised files into a new snapshot,
// hands it to the lazy layer server and adds it to later, whose
// background fetch of the rest the pull starts once its layers are in.
func (s *Service) ensureLazyLayer(ctx context.Context, key string, blob lazy.Blob, src layerSource, slots *semaphore.Weighted, later *laterFetches) (err error) {
	if snap, ok, err := s.snaps.Get(key); ok || err != nil {
		if err != nil {
			return err
		}
		// Detached when its server died (lostLazyLocked), or maybe never
		// mounted (mountOnServer): maybe an empty folder.
		// Its blob is sound: pulled whole meanwhile (ErrNotLazy), so
		// that new pods of the image start while old ones hold it.
		if why := s.lazyLayerStale(key); why != "" {
			return fmt.Errorf("%w: lazy layer %s %s, until it is collected", lazy.ErrNotLazy, key, why)
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
	endDemand := s.holdLazyFetches()
	size, inodes, err := lazy.Prepare(ctx, lazyDir(dir), src.lazy, blob, lazy.Options{Log: s.log, Find: s.findChunk})
	endDemand()
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
		err = s.mountLazy(snap, src.lazySource)
		switch {
		case err == nil:
			crashpoint.Hit("pull", "lazy layer handed to the server")
			later.add(key)
			return nil
		case errors.Is(err, lazyd.ErrNoAnswer):
			// The server may mount it yet: the snapshot stays, counted
			// and taken as served (mountOnServer), for the collection
			// after the failed pull (store) to unmount through the server
			// before it removes the folder.
			return err
		default:
			err = errors.Join(err, s.snaps.Remove(key))
		}
	}
	s.releaseLazy(key)
	return err
}

// holdLazyFetches holds the lazy layer server's background fetches (of
// the layers pulled before) while this pull fetches a layer's TOC and
// prioritised files, which its container waits for, until end is called.
// With no server running (or one of another protocol version, or one
// that exits meanwhile, idle) there is none to hold. A hold that fails
// otherwise leaves the pull as it is, logged.
func (s *Service) holdLazyFetches() (end func()) {
	s.lazydMu.Lock()
	c := s.lazyd
	s.lazydMu.Unlock()
	if c == nil || s.lazyServerForeign() {
		return func() {}
	}
	endDemand, err := c.Demand()
	if err != nil {
		if !lazyd.Gone(err) {
			s.log.Warn("hold the lazy layers' background fetch during a pull; it goes on", "err", err)
		}
		return func() {}
	}
	return func() {
		if err := endDemand(); err != nil && !lazyd.Gone(err) {
			s.log.Warn("end a pull's hold of the lazy layers' background fetch; it ends when its lease runs out", "err", err)
		}
	}
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

// lazyStatus is the lazy layer server's status; false when none serves.
func (s *Service) lazyStatus() (lazyd.Status, bool) {
	s.lazydMu.Lock()
	c := s.lazyd
	s.lazydMu.Unlock()
	if c == nil {
		return lazyd.Status{}, false
	}
	st, err := c.Status()
	if err != nil {
		s.log.Warn("lazy layer server status", "err", err)
		return lazyd.Status{}, false
	}
	return st, true
}

// diskSize is what a snapshot takes on disk: a lazy layer's cache so far
// (st: the server's status), another layer's unpacked size.
func diskSize(snap snapshot.Snapshot, st lazyd.Status) int64 {
	if l, ok := st.Layers[snap.ChainID]; ok {
		return l.DiskBytes
	}
	return snap.Size
}

// sizeLazy sets the size of img, which has lazy layers, from what their
// caches take now: the kubelet's image GC weighs images by it.
func (s *Service) sizeLazy(img *Image) {
	if !slices.ContainsFunc(img.ChainIDs, isLazyKey) {
		return
	}
	st, _ := s.lazyStatus()
	var size uint64
	for _, key := range img.ChainIDs {
		snap, ok, err := s.snaps.Get(key)
		if err != nil || !ok {
			return // being removed: the stored size stands
		}
		size += uint64(diskSize(snap, st))
	}
	img.Size = size
}

// lazyCallTimeout bounds each call to the lazy layer server; tests
// shorten it.
var lazyCallTimeout = lazyd.CallTimeout

// lazyServer is the connection to the lazy layer server, which is started
// if none serves.
func (s *Service) lazyServer() (*lazyd.Client, error) {
	s.lazydMu.Lock()
	defer s.lazydMu.Unlock()
	return s.lazyServerLocked()
}

func (s *Service) lazyServerLocked() (*lazyd.Client, error) {
	if s.lazyd != nil {
		return s.lazyd, nil
	}
	if len(s.opts.LazyServer) == 0 {
		return nil, errors.New("no lazy layer server command (image.Options.LazyServer)")
	}
	c, err := lazyd.Dial(s.opts.LazyDir, lazyCallTimeout)
	if errors.Is(err, lazyd.ErrNotServing) {
		c, err = lazyd.Start(context.Background(), s.opts.LazyServer,
			lazyd.ServeConfig{Dir: s.opts.LazyDir, Fetches: s.opts.LazyFetches, FetchQuiet: s.opts.LazyFetchQuiet, GzipDecoder: s.opts.GzipDecoder}, lazyCallTimeout)
	}
	if err != nil {
		return nil, err
	}
	s.attachLazy(c)
	return c, nil
}

// attachLazy makes c the connection to the server and watches it for
// layers that fail their verification.
func (s *Service) attachLazy(c *lazyd.Client) {
	s.lazyd = c
	go s.watchLazy(c)
}

// watchRetry is watchLazy's pause after a status call that failed with
// the server still there.
const watchRetry = 5 * time.Second

// watchLazy forgets the images of each layer the server reports broken
// (forgetImagesOf), also those that broke while no berthd ran, until the
// connection closes.
func (s *Service) watchLazy(c *lazyd.Client) {
	forgotten := brokenLayers{keys: map[string]bool{}}
	var seen uint64
	for wait := false; ; wait = true {
		st, err := c.WaitStatus(wait, seen)
		if err != nil && !lazyd.Gone(err) {
			// Wedged or misread, not gone: its mounts stay, and it is
			// asked again after a pause.
			s.log.Warn("lazy layer server status", "err", err)
			time.Sleep(watchRetry)
			continue
		}
		if err != nil {
			s.lazydMu.Lock()
			var lost []string
			if s.lazyd == c {
				lost = s.lostLazyLocked(err)
			}
			s.lazydMu.Unlock()
			s.forgetLostLazy(lost)
			return
		}
		seen = st.Events
		for _, key := range forgotten.newlyBroken(st) {
			s.log.Error("lazy layer failed its verification: its reads fail with EIO", "layer", key, "err", st.Layers[key].Broken)
			s.forgetImagesOf(key, "its lazy layer failed its verification")
		}
	}
}

// brokenLayers are the served lazy layers whose images watchLazy forgot
// for failing their verification, and the server's event count then.
type brokenLayers struct {
	keys   map[string]bool
	events uint64
}

// newlyBroken returns the layers of st broken since the last status, and
// drops those st no longer has, so that the set is never larger than the
// server's. A layer collected, pulled again and broken again under its key
// is returned again: once the server's events (one a break) outnumber the
// layers new to the set, every broken layer is, forgetting its images
// again being harmless.
func (b *brokenLayers) newlyBroken(st lazyd.Status) []string {
	var keys, again []string
	for key, l := range st.Layers {
		switch {
		case l.Broken == "":
		case !b.keys[key]:
			b.keys[key] = true
			keys = append(keys, key)
		default:
			again = append(again, key)
		}
	}
	if st.Events-b.events > uint64(len(keys)) {
		keys = append(keys, again...)
	}
	b.events = st.Events
	for key := range b.keys {
		if _, ok := st.Layers[key]; !ok {
			delete(b.keys, key)
		}
	}
	return keys
}

// lostLazyLocked lets go of the lazy layer server, found dead (err), and
// returns the keys of the layers it served. Their mounts are detached:
// every access to them failed (ENOTCONN), and collection could not remove
// them; so that no new container finds one empty, a pull of one takes its blob whole
// until it is collected, and forgetLostLazy forgets their images. Called
// with lazydMu held: no new server mounts meanwhile.
func (s *Service) lostLazyLocked(err error) []string {
	s.log.Error("lost the lazy layer server: its layers are detached and their images pulled again", "err", err)
	s.lazyd.Close()
	s.lazyd = nil
	s.lazydForeign.Store(false)
	if err := lazy.DetachStale(filepath.Join(s.opts.Root, "snapshots"), nil); err != nil {
		s.log.Warn("detach the lost lazy layer server's mounts", "err", err)
	}
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	lost := slices.Collect(maps.Keys(s.lazyServed))
	for _, key := range lost {
		s.lazyStale[key] = "lost its server"
	}
	clear(s.lazyServed)
	return lost
}

// forgetLostLazy forgets the images of the layers of a lost server
// (lostLazyLocked), outside lazydMu.
func (s *Service) forgetLostLazy(keys []string) {
	for _, key := range keys {
		s.forgetImagesOf(key, "the server of its lazy layer died")
	}
}

// lazyLayerStale says why the lazy snapshot key is not to be reused until
// collected; empty: it may be.
func (s *Service) lazyLayerStale(key string) string {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	return s.lazyStale[key]
}

// lazyServerForeign says whether the lazy layer server speaks another
// protocol version: no new layer goes to it (lazyBlob pulls it whole).
func (s *Service) lazyServerForeign() bool {
	return s.lazydForeign.Load() // not lazydMu: a Mount in flight holds it
}

// mountLazy has the server serve a lazy snapshot at its fs folder,
// fetching what is missing from src (nil: a complete layer).
func (s *Service) mountLazy(snap snapshot.Snapshot, src *registry.BlobSource) error {
	lost, err := s.mountOnServer(snap, src)
	s.forgetLostLazy(lost)
	return err
}

// mountOnServer is mountLazy under lazydMu; it returns the keys of a
// server it found dead (lostLazyLocked).
func (s *Service) mountOnServer(snap snapshot.Snapshot, src *registry.BlobSource) (lost []string, err error) {
	s.lazydMu.Lock()
	defer s.lazydMu.Unlock() // Mount and an idle server's Exit exclude each other
	c, err := s.lazyServerLocked()
	if err != nil {
		return nil, err
	}
	fsDir := s.snaps.Dir(snap)
	err = c.Mount(lazyd.MountArgs{Key: snap.ChainID, Dir: lazyDir(fsDir), FSDir: fsDir, Source: src, StallTimeout: s.opts.ProgressTimeout})
	if lazyd.Gone(err) && s.lazyd == c {
		lost = s.lostLazyLocked(err) // the next layer starts a new server
	}
	// A Mount without an answer may still be carried out: the layer is
	// taken as served, so that its removal unmounts it through the server
	// (whose Unmount waits for a mount under way) before the folder goes,
	// and not reused, since it may never be.
	if noAnswer := errors.Is(err, lazyd.ErrNoAnswer); err == nil || noAnswer {
		s.lazyMu.Lock()
		// Its full size is what it counts against lazy_cache_max_bytes, a
		// complete layer served again after a restart included.
		s.lazyServed[snap.ChainID], s.lazySizes[snap.ChainID] = true, snap.Size
		if noAnswer {
			s.lazyStale[snap.ChainID] = "got no answer from the lazy layer server when handed over"
		}
		s.lazyMu.Unlock()
	}
	if err != nil {
		return lost, fmt.Errorf("mount lazy layer %s: %w", snap.ChainID, err)
	}
	return nil, nil
}

// laterFetches are the lazy layers a pull mounted, whose background
// fetch of the rest waits until the pull's layers are all in (or it
// failed): started at mount, it took the link, the disk and the CPU from
// the prioritised files of the layers after it (issue #40's profile).
type laterFetches struct {
	mu   sync.Mutex
	keys []string
}

func (f *laterFetches) add(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
}

// startFetches has the server start the background fetch of each layer
// added to f.
func (s *Service) startFetches(f *laterFetches) {
	f.mu.Lock()
	keys := f.keys
	f.keys = nil
	f.mu.Unlock()
	if len(keys) == 0 {
		return
	}
	c, err := s.lazyServer()
	for _, key := range keys {
		if err == nil {
			err = c.Complete(key)
		}
		if err != nil {
			s.log.Warn("start the background fetch of a lazy layer; reads fetch what they need", "layer", key, "err", err)
		}
	}
}

// runningLazyServer connects to the lazy layer server a stopped or killed
// berthd left serving, nil if none serves, and returns its status. The
// lazy mounts it does not serve, all of them if none runs, are a dead
// server's and are detached: every access to them fails (ENOTCONN), so
// they could be neither served again nor removed. A server of another
// protocol version, whose status may not say where its layers are, keeps
// every mount. It runs before the snapshot store looks at their folders.
func runningLazyServer(opts Options) (*lazyd.Client, lazyd.Status, error) {
	snapshots := filepath.Join(opts.Root, "snapshots")
	c, err := lazyd.Dial(opts.LazyDir, lazyCallTimeout)
	if err != nil {
		return nil, lazyd.Status{}, lazy.DetachStale(snapshots, nil)
	}
	st, err := c.Status()
	if err != nil {
		c.Close()
		return nil, lazyd.Status{}, fmt.Errorf("the running lazy layer server: %w", err)
	}
	if st.Version != lazyd.ProtocolVersion {
		opts.Logger.Error("the running lazy layer server speaks another protocol version: it serves its layers until they are collected, and new layers are pulled whole until it exits",
			"server_version", st.Version, "version", lazyd.ProtocolVersion)
		return c, st, nil
	}
	served := map[string]bool{}
	for _, l := range st.Layers {
		served[filepath.Clean(l.FSDir)] = true
	}
	return c, st, lazy.DetachStale(snapshots, served)
}

// restoreLazy carries on with the lazy layers of the last berthd. Those
// the running server c (status st; nil: none runs) serves stay as they
// are (their background fetch started again if it was not); the server
// stops serving those whose snapshot is gone. A layer no server serves is
// served by a new one from its cache if complete, else dropped (its
// images with it, pulled again on demand): the registry source of its
// pull, credentials included, was the old server's, in memory only. A
// running server of another protocol version takes no new layer: the
// complete ones are dropped too.
func (s *Service) restoreLazy(c *lazyd.Client, st lazyd.Status) error {
	snaps, err := s.snaps.List()
	if err != nil {
		return err
	}
	running := c != nil
	var errs []error
	onDisk := map[string]bool{}
	for _, snap := range snaps {
		dir := lazyDir(s.snaps.Dir(snap))
		if !lazy.IsLayer(dir) {
			continue
		}
		onDisk[snap.ChainID] = true
		if l, ok := st.Layers[snap.ChainID]; ok {
			s.lazyMu.Lock()
			s.lazyServed[snap.ChainID], s.lazySizes[snap.ChainID] = true, l.FullSize
			s.lazyMu.Unlock()
			if !l.Complete && l.Broken == "" {
				errs = append(errs, c.Complete(snap.ChainID))
			}
			continue
		}
		if lazy.IsComplete(dir) && !s.lazydForeign.Load() {
			errs = append(errs, s.mountLazy(snap, nil))
			continue
		}
		s.log.Warn("dropping a lazy layer no server can serve (its server is gone before it was complete, or speaks another protocol version); its images are pulled again", "layer", snap.ChainID)
		errs = append(errs, s.snaps.Remove(snap.ChainID))
	}
	if running {
		for key := range st.Layers {
			if !onDisk[key] {
				errs = append(errs, c.Unmount(key))
			}
		}
	}
	errs = append(errs, s.exitIdleLazy())
	return errors.Join(errs...)
}

// forgetImagesOf removes the images whose layers include the lazy
// snapshot key, which cannot serve (why): it failed its verification, or
// its server died. The kubelet pulls them again, and that pull fails
// naming the cause (ensureLazyLayer) until the snapshot is collected once
// no container uses it. The server counts verification failures
// (berth_image_lazy_layer_verification_failures_total).
func (s *Service) forgetImagesOf(key, why string) {
	err := s.images.update(s.opts.DB, func(tx *bolt.Tx) error {
		for _, img := range s.images.all(func(img *Image) bool { return slices.Contains(img.ChainIDs, key) }) {
			s.log.Warn("forgetting an image: "+why, "image", img.ID, "layer", key)
			if err := s.images.delete(tx, img.ID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("forget the images of a lazy layer: "+why, "layer", key, "err", err)
	}
	s.requestGC()
}

// removeSnapshot has the server stop serving a lazy snapshot, then
// removes it; the server exits with its last layer. One still in use
// stays for the next collection.
func (s *Service) removeSnapshot(key string) error {
	s.lazyMu.Lock()
	served := s.lazyServed[key]
	s.lazyMu.Unlock()
	if served {
		c, err := s.lazyServer()
		if err == nil {
			err = c.Unmount(key)
		}
		if err != nil {
			return fmt.Errorf("unmount lazy layer %s: %w", key, err)
		}
		s.lazyMu.Lock()
		delete(s.lazyServed, key)
		s.lazyMu.Unlock()
	}
	if err := s.snaps.Remove(key); err != nil {
		return err
	}
	s.lazyMu.Lock()
	delete(s.lazySizes, key)
	delete(s.lazyStale, key)
	s.lazyMu.Unlock()
	if served {
		return s.exitIdleLazy()
	}
	return nil
}

// exitIdleLazy has a server that serves no layer exit: nothing of lazy
// pulls stays on a node without lazy layers.
func (s *Service) exitIdleLazy() error {
	s.lazydMu.Lock()
	defer s.lazydMu.Unlock()
	s.lazyMu.Lock()
	idle := len(s.lazyServed) == 0
	s.lazyMu.Unlock()
	if s.lazyd == nil || !idle {
		return nil
	}
	c := s.lazyd
	s.lazyd = nil
	s.lazydForeign.Store(false)
	err := c.Exit()
	c.Close()
	if err != nil {
		return fmt.Errorf("stop the idle lazy layer server: %w", err)
	}
	return nil
}

// closeLazy lets go of the lazy layer server, which keeps serving the
// layers for the containers on them and the next berthd; one that serves
// none exits.
func (s *Service) closeLazy() {
	if err := s.exitIdleLazy(); err != nil {
		s.log.Warn("lazy layer server at shutdown", "err", err)
	}
	s.lazydMu.Lock()
	defer s.lazydMu.Unlock()
	if s.lazyd != nil {
		c := s.lazyd
		s.lazyd = nil // watchLazy's call ends without a complaint
		c.Close()
	}
}

// findChunk names a cached chunk of digest d in one of the served lazy
// layers: what a partial pull links rather than fetches.
func (s *Service) findChunk(d digest.Digest) (string, bool) {
	s.lazydMu.Lock()
	c := s.lazyd
	s.lazydMu.Unlock()
	if c == nil {
		return "", false
	}
	p, ok, err := c.FindChunk(d.String())
	if err != nil {
		s.log.Warn("look for a cached chunk in the lazy layers; it is fetched", "chunk", d, "err", err)
	}
	return p, ok
}
