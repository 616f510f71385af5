package image

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/content"
	"github.com/berth-runtime/berth/image/gunzip"
	"github.com/berth-runtime/berth/image/lazyd"
	"github.com/berth-runtime/berth/image/reference"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/berth-runtime/berth/image/snapshot"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
)

// Options configure the image service.
type Options struct {
	Root            string                   // persistent root: Root/content, Root/snapshots
	DB              *bolt.DB                 // meta.db, shared with the rest of berthd
	Registries      map[string]registry.Host // from [registry."HOST"]
	ProgressTimeout time.Duration            // cancel a pull that moves no byte for this long
	MaxLayerBytes   int64                    // bound of a layer's uncompressed size (0: unbounded)
	MaxLayerEntries int64                    // bound of a layer's tar entries (0: unbounded)
	// MaxConcurrentDownloads bounds the layer downloads (connections) of
	// all pulls together; 0: no bound but each pull's parallelLayers.
	MaxConcurrentDownloads int
	// GzipDecoder is one of gunzip.Modes ("": auto).
	GzipDecoder string
	// Lazy pulls eStargz layers lazily (lazy.go); it needs /dev/fuse.
	Lazy bool
	// LazyFetches bounds the background requests of all lazy layers
	// together (0: defaultLazyFetches).
	LazyFetches int
	// LazyFetchQuiet holds the background requests until on-demand
	// fetches have been quiet this long (lazy.Fetches); 0: no hold.
	LazyFetchQuiet time.Duration
	// LazyCacheMaxBytes bounds the lazy layers' full sizes together: a
	// layer past it is pulled whole (0: no bound).
	LazyCacheMaxBytes int64
	// LazyServer is the command that starts the lazy layer server
	// (image/lazyd), which serves in LazyDir (under berthd's state
	// folder) and outlives berthd.
	LazyServer []string
	LazyDir    string
	Logger     *slog.Logger
	Metrics    prometheus.Registerer // takes the pull and image series; nil: none
}

// Service stores images and answers for them.
type Service struct {
	opts      Options
	log       *slog.Logger
	content   *content.Store
	snaps     *snapshot.Store
	resolver  atomic.Pointer[registry.Resolver] // replaced by SetRegistries
	images    *images                           // the records, in memory
	platform  v1.Platform
	metrics   *metrics // nil: no metrics
	downloads downloadSlots
	gzip      gunzip.Decoder

	pullsMu sync.Mutex
	pulls   map[string]*pullFlight // one transfer per reference and credentials at a time

	inflightMu sync.Mutex
	inflight   map[string]*layerFlight // unpacks in progress, by chain ID and blob

	// Holds (gc.go) keep what pulls, imports and Lease are about to
	// reference from collection; removing is what a collection is deleting.
	holdMu   sync.Mutex
	holdCond *sync.Cond
	held     map[string]int
	removing map[string]bool

	lazydMu sync.Mutex
	lazyd   *lazyd.Client // the lazy layer server; nil: none started or found
	// lazydForeign: lazyd speaks another ProtocolVersion (a server an older
	// berthd left); it keeps serving its layers, and no new one goes to it.
	lazydForeign atomic.Bool
	lazyMu       sync.Mutex
	lazyServed   map[string]bool   // the snapshot keys the server serves
	lazyStale    map[string]string // lazy snapshots not reused until collected, and why: their server died (detached), their Mount got no answer
	lazySizes    map[string]int64  // full sizes of the lazy layers stored or being stored, by snapshot key

	gcMu         sync.Mutex  // one collection at a time
	freePartials atomic.Bool // the next collection removes every partial download no pull writes
	gcWake       chan struct{}
	gcStop       chan struct{}
	gcDone       chan struct{}
	closeOnce    sync.Once
}

// SetRegistries replaces the registry settings (berthd's SIGHUP): pulls
// that start from now on use them, pulls under way finish with the old.
// Invalid settings change nothing.
func (s *Service) SetRegistries(hosts map[string]registry.Host) error {
	r, err := registry.NewResolver(hosts)
	if err != nil {
		return err
	}
	s.resolver.Store(r)
	return nil
}

// New opens the stores under opts.Root, dropping what a crash left unfinished
// and images whose layers are gone.
func New(opts Options) (_ *Service, err error) {
	if opts.ProgressTimeout <= 0 {
		opts.ProgressTimeout = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	resolver, err := registry.NewResolver(opts.Registries)
	if err != nil {
		return nil, err
	}
	if opts.Lazy {
		if err := checkFUSE(); err != nil {
			return nil, err
		}
	}
	if opts.LazyFetches <= 0 {
		opts.LazyFetches = defaultLazyFetches
	}
	cs, err := content.Open(filepath.Join(opts.Root, "content"))
	if err != nil {
		return nil, err
	}
	running, runningStatus, err := runningLazyServer(opts)
	if err != nil {
		return nil, err
	}
	snaps, err := snapshot.Open(filepath.Join(opts.Root, "snapshots"), opts.DB, opts.Logger)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			snaps.Close()
		}
	}()
	if err := opts.DB.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{imagesBucket, leasesBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	s := &Service{
		opts: opts, log: opts.Logger, content: cs, snaps: snaps,
		platform:  v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		downloads: newDownloadSlots(opts.MaxConcurrentDownloads),
		inflight:  map[string]*layerFlight{}, pulls: map[string]*pullFlight{},
		held: map[string]int{}, removing: map[string]bool{},
		lazyServed: map[string]bool{}, lazyStale: map[string]string{}, lazySizes: map[string]int64{},
		gcWake: make(chan struct{}, 1), gcStop: make(chan struct{}), gcDone: make(chan struct{}),
	}
	s.resolver.Store(resolver)
	s.holdCond = sync.NewCond(&s.holdMu)
	if s.images, err = loadImages(opts.DB); err != nil {
		return nil, err
	}
	s.metrics = newMetrics(opts.Metrics, s)
	if s.gzip, err = gunzip.Choose(opts.GzipDecoder); err != nil {
		return nil, err
	}
	s.log.Info("gzip layers: "+s.gzip.Name()+" decoder", "decoder", s.gzip.Name(), "why", s.gzip.Why)
	if running != nil {
		s.attachLazy(running)
		s.lazydForeign.Store(runningStatus.Version != lazyd.ProtocolVersion)
	}
	defer func() {
		if err != nil {
			s.closeLazy()
		}
	}()
	if err := s.restoreLazy(running, runningStatus); err != nil {
		return nil, err
	}
	if err := s.dropBrokenImages(); err != nil {
		return nil, err
	}
	if err := s.collectGarbage(); err != nil {
		return nil, err
	}
	go s.gcLoop()
	return s, nil
}

// GzipDecoder names the decoder gzip layers go through and why it was
// chosen, for verbose Status: a node on the builtin one pulls compressed
// files with about 1.5 times the CPU.
func (s *Service) GzipDecoder() string {
	return s.gzip.Name() + " (" + s.gzip.Why + ")"
}

// dropBrokenImages forgets images whose snapshots did not survive (a crash
// mid-removal, or a hand-cleaned folder), so that the kubelet pulls them again.
func (s *Service) dropBrokenImages() error {
	return s.images.update(s.opts.DB, func(tx *bolt.Tx) error {
		for _, img := range s.images.all(nil) {
			for _, c := range img.ChainIDs {
				if _, ok, err := s.snaps.Get(c); err != nil || !ok {
					s.log.Warn("forgetting image with a missing layer", "image", img.ID, "layer", c)
					if err := s.images.delete(tx, img.ID); err != nil {
						return err
					}
					break
				}
			}
		}
		return nil
	})
}

// Get returns the image ref names (ID, tag or digest), or an error wrapping
// ErrNotFound.
func (s *Service) Get(ref string) (*Image, error) {
	img, err := s.images.find(ref)
	if err == nil && img == nil {
		err = fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	if img != nil {
		s.sizeLazy(img)
	}
	return img, err
}

// List returns the images filter names (see images.match), every stored
// image when it is empty.
func (s *Service) List(filter string) ([]*Image, error) {
	var imgs []*Image
	var err error
	if filter == "" {
		imgs = s.images.all(nil)
	} else {
		imgs, err = s.images.match(filter)
	}
	for _, img := range imgs {
		s.sizeLazy(img)
	}
	return imgs, err
}

// Remove deletes what ref names: a tag of an image that has other names
// only loses that tag; otherwise the whole image goes, and then every layer
// and blob no image needs any more, soon, in the background, with the
// partial downloads no pull is writing: removing images is how the
// kubelet's image GC frees the disk. A missing image is not an error.
func (s *Service) Remove(ref string) error {
	r, parseErr := reference.Parse(ref)
	err := s.images.update(s.opts.DB, func(tx *bolt.Tx) error {
		img, err := s.images.find(ref)
		if err != nil || img == nil {
			return err
		}
		if parseErr == nil && r.Digest == "" && len(img.RepoTags) > 1 {
			img.RepoTags = slices.DeleteFunc(img.RepoTags, func(t string) bool { return t == r.TagString() })
			return s.images.put(tx, img)
		}
		return s.images.delete(tx, img.ID)
	})
	if err != nil {
		return err
	}
	crashpoint.Hit("remove image", "record deleted")
	s.requestGCFreeingPartials()
	return nil
}

// FsInfo reports the space the image store (snapshots and content) uses,
// and the mount point of the filesystem it is on.
func (s *Service) FsInfo() (FsUsage, error) {
	u := FsUsage{Timestamp: time.Now()}
	mp, err := Mountpoint(s.opts.Root)
	if err != nil {
		return u, err
	}
	u.Mountpoint = mp
	snaps, err := s.snaps.List()
	if err != nil {
		return u, err
	}
	st, _ := s.lazyStatus()
	for _, snap := range snaps {
		u.UsedBytes += uint64(diskSize(snap, st))
		u.Inodes += uint64(snap.Inodes)
	}
	b, n, err := s.content.Usage()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return u, err
	}
	u.UsedBytes += b
	u.Inodes += n
	return u, nil
}
