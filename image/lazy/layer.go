// Package lazy serves eStargz image layers whose files come from the
// registry on first read: a layer's table of contents (TOC) is fetched at
// pull time, its files are a read-only FUSE filesystem, and each chunk a
// read needs is fetched by a ranged request, checked against the digest
// the TOC gives it, and kept in the layer's cache folder. The TOC itself is
// checked against the digest the image manifest gives it (its layer
// descriptor's annotation), so every byte served traces back to the
// manifest the pull verified.
package lazy

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
)

// TOCDigestAnnotation is the layer descriptor's annotation that marks an
// eStargz layer and names the digest of its TOC.
const TOCDigestAnnotation = estargz.TOCJSONDigestAnnotation

// ErrNotLazy is returned (wrapped) by Prepare when the layer cannot be
// served lazily and is to be pulled whole: its blob has no eStargz footer,
// or the registry does not serve byte ranges.
var ErrNotLazy = errors.New("layer cannot be pulled lazily")

// ErrStalled is returned (wrapped) for a request that moved no byte for
// the layer's StallTimeout.
var ErrStalled = errors.New("no progress")

// Options tune a loaded layer.
type Options struct {
	Log *slog.Logger // nil: slog.Default
	// StallTimeout cancels a request that moves no byte for this long, so
	// that a read does not hang on a registry that stopped sending; 0: never.
	StallTimeout time.Duration
	// ReadFailed is called for every read that failed with EIO.
	ReadFailed func()
	// Find names a verified chunk of this digest that another layer of
	// the node has cached, if any: a partial pull takes it from there
	// rather than from the registry.
	Find func(digest.Digest) (path string, ok bool)
	// Broken is called once the complete layer failed its verification
	// (ErrVerification): its reads fail from then on.
	Broken func(error)
	// Inflate decompresses the whole blob for its diff ID check (the
	// node's gzip decoder, gunzip.Decoder.NewReader); nil: compress/gzip.
	Inflate func(io.Reader) (io.ReadCloser, error)
	// Fetches are the node's background fetches, which Complete goes
	// through and this layer's reads hold back; nil: one request at a
	// time, no hold.
	Fetches *Fetches
}

// Source fetches byte ranges of a blob (registry.Blobs, with the pull's
// credentials and endpoint).
type Source interface {
	Get(ctx context.Context, digest string, size int64, want registry.Span, ranged bool) (*registry.BlobBody, error)
}

// Blob names a layer's blob and the TOC digest its descriptor announces.
type Blob struct {
	Digest    digest.Digest `json:"digest"`
	Size      int64         `json:"size"`
	TOCDigest digest.Digest `json:"tocDigest"`
	DiffID    digest.Digest `json:"diffID,omitempty"` // the image config's; empty: only the blob digest is checked
	TailStart int64         `json:"tailStart"`        // where the saved tail (TOC and footer) starts in the blob
}

// Files in a layer's folder.
const (
	metaFile     = "blob.json"
	tailFile     = "toc"      // the blob's bytes from TailStart to its end
	chunksDir    = "chunks"   // one verified, uncompressed chunk per file, named by its offset in the blob
	completeFile = "complete" // every chunk is in chunksDir
)

// groupBytes is how many compressed bytes one background request asks for:
// the chunks of a layer are fetched in runs of about this size.
const groupBytes = 4 << 20

// parallelRuns is how many runs one layer's prioritised files (or a read)
// fetch at a time.
const parallelRuns = 4

// Prepare fetches the TOC of blob from src into dir (created), checks it
// against blob.TOCDigest, and fetches the prioritised files: the chunks
// before the format's prefetch landmark. It returns the layer's
// uncompressed size and entry count. The compressed bytes it fetches are
// kept until the complete layer is verified against blob.Digest and
// blob.DiffID (Complete; not for a layer with chunks linked from another).
func Prepare(ctx context.Context, dir string, src Source, blob Blob, opts Options) (size, inodes int64, err error) {
	// The pull's own progress watch covers these requests.
	foot, err := fetch(ctx, src, blob, registry.Span{Start: max(blob.Size-estargz.FooterSize, 0), End: blob.Size}, 0)
	if err != nil {
		return 0, 0, err
	}
	tocOff, _, err := estargz.OpenFooter(io.NewSectionReader(bytes.NewReader(foot), 0, int64(len(foot))))
	if err != nil || tocOff <= 0 || tocOff >= blob.Size {
		return 0, 0, fmt.Errorf("%w: blob %s has no eStargz footer", ErrNotLazy, blob.Digest)
	}
	// Open reads a little before the TOC on a tiny blob: keep that too.
	blob.TailStart = max(min(tocOff, blob.Size-1024), 0)
	tail, err := fetch(ctx, src, blob, registry.Span{Start: blob.TailStart, End: blob.Size}, 0)
	if err != nil {
		return 0, 0, err
	}
	for _, d := range []string{chunksDir, rawDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return 0, 0, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, tailFile), tail, 0o600); err != nil {
		return 0, 0, err
	}
	if err := keepRaw(dir, registry.Span{Start: blob.TailStart, End: blob.Size}, tail); err != nil {
		return 0, 0, err
	}
	meta, err := json.Marshal(blob)
	if err != nil {
		return 0, 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, metaFile), meta, 0o600); err != nil {
		return 0, 0, err
	}
	l, err := Load(dir, src, opts)
	if err != nil {
		return 0, 0, err
	}
	defer l.cancel()
	if err := l.fetchChunks(ctx, l.prioritised()); err != nil {
		return 0, 0, fmt.Errorf("prioritised files: %w", err)
	}
	return l.FullSize(), int64(len(l.entries)), nil
}

// fetch reads span of the blob whole, cancelled when no byte came for
// stall (0: never); a registry that answers with the whole blob does not
// serve ranges.
func fetch(ctx context.Context, src Source, blob Blob, span registry.Span, stall time.Duration) ([]byte, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	progress := func() {}
	if stall > 0 {
		timer := time.AfterFunc(stall, func() {
			cancel(fmt.Errorf("%w: blob %s %s moved no byte for %s", ErrStalled, blob.Digest, span.RangeHeader(), stall))
		})
		defer timer.Stop()
		progress = func() { timer.Reset(stall) }
	}
	buf, err := fetchBody(ctx, src, blob, span, progress)
	if err != nil && ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	return buf, err
}

func fetchBody(ctx context.Context, src Source, blob Blob, span registry.Span, progress func()) ([]byte, error) {
	body, err := src.Get(ctx, blob.Digest.String(), blob.Size, span, true)
	if err != nil {
		if errors.Is(err, registry.ErrRangeRefused) {
			return nil, fmt.Errorf("%w: %v", ErrNotLazy, err)
		}
		return nil, err
	}
	defer body.Close()
	if !body.Ranged {
		return nil, fmt.Errorf("%w: the registry does not serve byte ranges of blob %s", ErrNotLazy, blob.Digest)
	}
	buf := make([]byte, span.Len())
	for n := 0; n < len(buf); {
		m, err := body.Read(buf[n:])
		if m > 0 {
			n += m
			progress()
		}
		if err == io.EOF && n < len(buf) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("blob %s %s: %w", blob.Digest, span.RangeHeader(), err)
		}
	}
	return buf, nil
}

// chunk is one compressed chunk of a file: its TOC entry and where its
// compressed bytes end in the blob.
type chunk struct {
	ent *estargz.TOCEntry
	end int64
}

func (c chunk) name() string { return strconv.FormatInt(c.ent.Offset, 10) }

// Layer is one prepared layer: its TOC, its cache, and the source of the
// chunks not yet cached (none after a restart of berthd).
type Layer struct {
	dir      string
	blob     Blob
	toc      *estargz.Reader
	verify   estargz.TOCEntryVerifier
	src      Source // nil: a missing chunk fails its read
	opts     Options
	entries  []*estargz.TOCEntry // every entry, in TOC order
	chunks   []chunk             // every data chunk, in blob order
	landmark int64               // the prefetch landmark's offset, 0 if none

	mu      sync.Mutex
	have    map[int64]bool          // cached chunks, by offset in the blob
	digests map[digest.Digest]int64 // the chunks' digests, to the offset of one chunk of each
	flights map[int64]chan struct{} // on-demand fetches under way
	broken  error                   // the complete layer failed its verification: every read fails
	disk    atomic.Int64            // bytes of the files in dir (DiskBytes)

	ctx        context.Context // cancelled by Close: stops fetches
	cancel     context.CancelFunc
	background sync.WaitGroup // the fetch Complete started
	srv        *fuse.Server   // while mounted
}

// Load opens a prepared layer from dir. src may be nil: then only cached
// chunks can be read.
func Load(dir string, src Source, opts Options) (*Layer, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.ReadFailed == nil {
		opts.ReadFailed = func() {}
	}
	if opts.Find == nil {
		opts.Find = func(digest.Digest) (string, bool) { return "", false }
	}
	if opts.Broken == nil {
		opts.Broken = func(error) {}
	}
	if opts.Inflate == nil {
		opts.Inflate = func(r io.Reader) (io.ReadCloser, error) { return gzip.NewReader(r) }
	}
	if opts.Fetches == nil {
		opts.Fetches = NewFetches(1, 0)
	}
	var blob Blob
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &blob); err != nil {
		return nil, fmt.Errorf("%s: %w", metaFile, err)
	}
	tail, err := os.ReadFile(filepath.Join(dir, tailFile))
	if err != nil {
		return nil, err
	}
	toc, err := estargz.Open(io.NewSectionReader(tailReader{tail, blob.TailStart}, 0, blob.Size))
	if err != nil {
		return nil, fmt.Errorf("blob %s: TOC: %w", blob.Digest, err)
	}
	verify, err := toc.VerifyTOC(blob.TOCDigest)
	if err != nil && toc.TOCDigest() == blob.TOCDigest {
		// The image's own TOC, whose chunks cannot each be checked: some
		// lack a digest, or several files share one gzip member.
		return nil, fmt.Errorf("%w: blob %s: %v", ErrNotLazy, blob.Digest, err)
	}
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", blob.Digest, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Layer{dir: dir, blob: blob, toc: toc, verify: verify, src: src, opts: opts,
		have: map[int64]bool{}, digests: map[digest.Digest]int64{}, flights: map[int64]chan struct{}{}, ctx: ctx, cancel: cancel,
		broken: Broken(dir)}
	if err := l.index(); err != nil {
		cancel()
		return nil, err
	}
	names, err := os.ReadDir(filepath.Join(dir, chunksDir))
	if err != nil {
		cancel()
		return nil, err
	}
	for _, n := range names {
		if off, err := strconv.ParseInt(n.Name(), 10, 64); err == nil {
			l.have[off] = true
		}
	}
	l.disk.Store(diskBytes(dir))
	return l, nil
}

// diskBytes adds up the sizes of the files under dir.
func diskBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// DiskBytes is what the layer takes on disk now: its TOC, the chunks
// fetched so far and the compressed bytes kept for its verification. A
// chunk linked from another layer's cache counts with that layer.
func (l *Layer) DiskBytes() int64 { return l.disk.Load() }

// FullSize is the layer's unpacked size: its cache's once every chunk is in.
func (l *Layer) FullSize() int64 {
	var size int64
	for _, e := range l.entries {
		size += max(e.Size, 0)
	}
	return size
}

// tailReader reads the saved tail of a blob: what estargz.Open asks for.
type tailReader struct {
	b     []byte
	start int64
}

func (t tailReader) ReadAt(p []byte, off int64) (int, error) {
	if off < t.start {
		return 0, fmt.Errorf("offset %d is before the saved TOC", off)
	}
	return bytes.NewReader(t.b).ReadAt(p, off-t.start)
}

// index lists the TOC's entries and data chunks. A chunk whose payload
// shares its gzip member with another (InnerOffset) was refused by
// VerifyTOC already (offsets must be unique).
func (l *Layer) index() error {
	root, ok := l.toc.Lookup("")
	if !ok {
		return errors.New("TOC has no root")
	}
	seen := map[*estargz.TOCEntry]bool{} // a hard link is its target under another name
	var walk func(e *estargz.TOCEntry)
	walk = func(e *estargz.TOCEntry) {
		e.ForeachChild(func(_ string, c *estargz.TOCEntry) bool {
			if seen[c] {
				return true
			}
			seen[c] = true
			l.entries = append(l.entries, c)
			switch c.Type {
			case "reg":
				l.addChunks(c)
			case "dir":
				walk(c)
			}
			return true
		})
	}
	walk(root)
	if lm, ok := l.toc.Lookup(estargz.PrefetchLandmark); ok {
		l.landmark = lm.Offset
	}
	slices.SortFunc(l.chunks, func(a, b chunk) int { return int(a.ent.Offset - b.ent.Offset) })
	return nil
}

func (l *Layer) addChunks(e *estargz.TOCEntry) {
	if e.Size == 0 {
		return
	}
	for off := int64(0); off < e.Size; {
		c, ok := l.toc.ChunkEntryForOffset(e.Name, off)
		if !ok || c.ChunkSize <= 0 {
			return
		}
		l.chunks = append(l.chunks, chunk{ent: c, end: c.NextOffset()})
		if d, err := digest.Parse(chunkDigest(e, c)); err == nil {
			l.digests[d] = c.Offset
		}
		off = c.ChunkOffset + c.ChunkSize
	}
}

// prioritised are the chunks before the prefetch landmark.
func (l *Layer) prioritised() []chunk {
	i, _ := slices.BinarySearchFunc(l.chunks, l.landmark, func(c chunk, off int64) int { return int(c.ent.Offset - off) })
	return l.chunks[:i]
}

// fetchChunks fetches cs (in blob order) in runs of neighbours, one
// request per run of up to groupBytes, up to parallelRuns at a time, so
// that the link is not idle while a run is inflated, verified and written.
func (l *Layer) fetchChunks(ctx context.Context, cs []chunk) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallelRuns)
	for _, run := range runs(l.reuse(cs)) {
		g.Go(func() error { return l.fetchRun(gctx, run) })
	}
	return g.Wait()
}

// runs splits cs into runs of chunks adjacent in the blob.
func runs(cs []chunk) [][]chunk {
	var out [][]chunk
	for i := 0; i < len(cs); {
		j := i + 1
		for j < len(cs) && cs[j].ent.Offset == cs[j-1].end && cs[j].end-cs[i].ent.Offset <= groupBytes {
			j++
		}
		out = append(out, cs[i:j])
		i = j
	}
	return out
}

// fetchRun fetches the compressed bytes of a run of adjacent chunks in one
// request and caches each chunk that passes its digest check.
func (l *Layer) fetchRun(ctx context.Context, run []chunk) error {
	if l.src == nil {
		return errors.New("no registry to fetch from (berthd restarted before the layer was complete)")
	}
	base := run[0].ent.Offset
	span := registry.Span{Start: base, End: run[len(run)-1].end}
	b, err := fetch(ctx, l.src, l.blob, span, l.opts.StallTimeout)
	if err != nil {
		return err
	}
	for _, c := range run {
		if err := l.store(c, b[c.ent.Offset-base:c.end-base]); err != nil {
			return err
		}
	}
	return l.keepRaw(span, b)
}

// store decompresses one chunk, checks its digest and caches it.
func (l *Layer) store(c chunk, compressed []byte) error {
	zr, err := gzip.NewReader(bytes.NewReader(compressed))
	if err != nil {
		return fmt.Errorf("chunk at %d of blob %s: %w", c.ent.Offset, l.blob.Digest, err)
	}
	data := make([]byte, c.ent.ChunkSize)
	if _, err := io.ReadFull(zr, data); err != nil {
		return fmt.Errorf("chunk at %d of blob %s: %w", c.ent.Offset, l.blob.Digest, err)
	}
	v, err := l.verify.Verifier(c.ent)
	if err != nil {
		return err
	}
	if _, err := v.Write(data); err != nil || !v.Verified() {
		return fmt.Errorf("chunk at %d of blob %s: digest mismatch", c.ent.Offset, l.blob.Digest)
	}
	if err := writeCached(filepath.Join(l.dir, chunksDir, c.name()), data); err != nil {
		return err
	}
	l.mu.Lock()
	if !l.have[c.ent.Offset] {
		l.disk.Add(int64(len(data)))
	}
	l.have[c.ent.Offset] = true
	l.mu.Unlock()
	return nil
}

// ensure makes chunk c cached, fetching it unless another read is.
func (l *Layer) ensure(c chunk) error {
	for {
		l.mu.Lock()
		if l.have[c.ent.Offset] {
			l.mu.Unlock()
			return nil
		}
		wait, busy := l.flights[c.ent.Offset]
		if !busy {
			wait = make(chan struct{})
			l.flights[c.ent.Offset] = wait
		}
		l.mu.Unlock()
		if busy {
			select {
			case <-wait:
				continue // cached, or failed: then this read tries itself
			case <-l.ctx.Done():
				return l.ctx.Err()
			}
		}
		done := l.opts.Fetches.Demand()
		err := l.fetchChunks(l.ctx, []chunk{c})
		done()
		l.mu.Lock()
		delete(l.flights, c.ent.Offset)
		l.mu.Unlock()
		close(wait)
		return err
	}
}

// readAt reads the file e at off into p from its chunks, fetching those
// not cached; a chunk that cannot be fetched or fails its digest fails the
// read.
func (l *Layer) readAt(e *estargz.TOCEntry, p []byte, off int64) (int, error) {
	l.mu.Lock()
	broken := l.broken
	l.mu.Unlock()
	if broken != nil {
		return 0, broken
	}
	n := 0
	for n < len(p) && off+int64(n) < e.Size {
		at := off + int64(n)
		ce, ok := l.toc.ChunkEntryForOffset(e.Name, at)
		if !ok {
			return n, fmt.Errorf("%s: no chunk at %d", e.Name, at)
		}
		c := chunk{ent: ce, end: ce.NextOffset()}
		if err := l.ensure(c); err != nil {
			return n, err
		}
		m, err := l.readCached(c, p[n:min(len(p), n+int(ce.ChunkOffset+ce.ChunkSize-at))], at-ce.ChunkOffset)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (l *Layer) readCached(c chunk, p []byte, off int64) (int, error) {
	f, err := os.Open(filepath.Join(l.dir, chunksDir, c.name()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.ReadAt(p, off)
}

// Complete fetches, in the background, every chunk not cached yet, through
// the node's Fetches (Options): a bounded number of requests at a time
// across the node's layers, each once on-demand fetches are quiet. Once
// all are in, it verifies the whole blob unless chunks were linked from
// another layer (finish): the layer is then marked complete, or broken.
// Close stops it. The channel it returns closes when it ends, the layer
// complete or not (a registry away, Close).
func (l *Layer) Complete() <-chan struct{} {
	ended := make(chan struct{})
	l.background.Go(func() {
		defer close(ended)
		var wg sync.WaitGroup
		var failed sync.Once
		for _, run := range runs(l.reuse(l.missing())) {
			if l.opts.Fetches.acquire(l.ctx) != nil {
				break
			}
			wg.Go(func() {
				defer l.opts.Fetches.release()
				err := l.fetchRun(l.ctx, run)
				if err != nil && l.ctx.Err() == nil {
					failed.Do(func() {
						l.opts.Log.Warn("lazy layer: background fetch failed; reads fetch what they need", "blob", l.blob.Digest, "err", err)
					})
				}
				if err == nil {
					crashpoint.Hit("lazy fetch", "chunks stored")
				}
			})
		}
		wg.Wait()
		if len(l.missing()) == 0 {
			l.finish()
		}
	})
	return ended
}

func (l *Layer) missing() []chunk {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(l.chunks), func(c chunk) bool { return l.have[c.ent.Offset] })
}

// IsComplete says whether every chunk of the layer in dir is cached.
func IsComplete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, completeFile))
	return err == nil
}

// IsLayer says whether dir holds a lazy layer.
func IsLayer(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, metaFile))
	return err == nil
}

// readFailed logs and counts a read that failed: the container saw EIO.
func (l *Layer) readFailed(name string, err error) {
	l.opts.ReadFailed()
	l.opts.Log.Warn("lazy layer: read failed with EIO", "blob", l.blob.Digest, "file", name, "err", err)
}

// chunkDigest is the digest the TOC gives chunk c of file e: a file of one
// chunk may have only its file digest.
func chunkDigest(e, c *estargz.TOCEntry) string {
	if c.ChunkDigest == "" && c == e && c.ChunkSize == e.Size {
		return e.Digest
	}
	return c.ChunkDigest
}

// CachedChunk names this layer's cached chunk of digest d, if it has one.
func (l *Layer) CachedChunk(d digest.Digest) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	off, ok := l.digests[d]
	if !ok || !l.have[off] {
		return "", false
	}
	return filepath.Join(l.dir, chunksDir, strconv.FormatInt(off, 10)), true
}

// reuse links into the cache the chunks of cs that another layer of the
// node has (same digest: same bytes, which that layer verified), and
// returns the others, in order.
func (l *Layer) reuse(cs []chunk) []chunk {
	var rest []chunk
	for _, c := range cs {
		if !l.reuseChunk(c) {
			rest = append(rest, c)
		}
	}
	return rest
}

func (l *Layer) reuseChunk(c chunk) bool {
	d, err := digest.Parse(chunkDigest(c.ent, c.ent))
	if err != nil {
		return false
	}
	src, ok := l.opts.Find(d)
	if !ok {
		return false
	}
	dst := filepath.Join(l.dir, chunksDir, c.name())
	switch err := os.Link(src, dst); {
	case errors.Is(err, os.ErrExist): // fetched or linked meanwhile
	case err != nil:
		return false // the other layer went meanwhile: fetch it
	case os.WriteFile(filepath.Join(l.dir, linkedFile), nil, 0o600) != nil:
		// Without the mark the complete layer would be checked as a
		// whole blob, which needs this chunk's compressed bytes.
		os.Remove(dst)
		return false
	}
	l.mu.Lock()
	l.have[c.ent.Offset] = true
	l.mu.Unlock()
	return true
}

// IsComplete says whether every chunk of the layer is cached and verified.
func (l *Layer) IsComplete() bool { return IsComplete(l.dir) }
