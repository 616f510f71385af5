package image

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/url"
	"sync"
	"syscall"

	"github.com/berth-runtime/berth/image/content"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/berth-runtime/berth/image/unpack"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
)

const (
	// rangedLayerMin is the size from which a layer downloads as parallel
	// byte ranges, where the registry serves ranges: below it one
	// connection is about as fast, and a connection costs a request.
	rangedLayerMin = 64 << 20
	// rangeConnections is how many connections one layer may use at most.
	rangeConnections = 4
	// minRangePart is the smallest part a layer is split into.
	minRangePart = 16 << 20
	// checkpointEvery is how far the complete prefix of a download moves
	// between records of its offset: what a killed berthd fetches again.
	checkpointEvery = 4 << 20
	// maxStalledRetries is how many times in a row a download is retried
	// after its connection broke without a byte coming in between.
	maxStalledRetries = 3
)

// downloadSlots bounds the layer downloads (connections) of the node:
// [image] max_concurrent_downloads. A nil sem is no bound.
type downloadSlots struct{ sem *semaphore.Weighted }

func newDownloadSlots(n int) downloadSlots {
	if n <= 0 {
		return downloadSlots{}
	}
	return downloadSlots{semaphore.NewWeighted(int64(n))}
}

func (s downloadSlots) acquire(ctx context.Context) error {
	if s.sem == nil {
		return nil
	}
	return s.sem.Acquire(ctx, 1)
}

// tryAcquire takes up to n slots without waiting and says how many.
func (s downloadSlots) tryAcquire(n int) int {
	if s.sem == nil {
		return n
	}
	got := 0
	for got < n && s.sem.TryAcquire(1) {
		got++
	}
	return got
}

func (s downloadSlots) release(n int) {
	if s.sem != nil && n > 0 {
		s.sem.Release(int64(n))
	}
}

// download fetches one blob into its partial file (content.Partial), from
// where an earlier attempt stopped, with one connection or, for a big
// layer at a registry that serves ranges, several, each writing its part
// at its offset. Its reader hands out the complete prefix in order.
type download struct {
	pullCtx context.Context // the pull's (or layer group's): cancelled, the pull gave up
	blobs   *registry.Blobs
	digest  digest.Digest
	size    int64
	file    *content.Partial
	slots   downloadSlots
	cancel  context.CancelCauseFunc
	ended   chan struct{} // closed when run returns

	mu       sync.Mutex
	cond     *sync.Cond    // signalled when complete or err change
	complete int64         // the prefix written
	saved    int64         // the prefix last checkpointed
	parts    []partWritten // of the round under way
	done     bool          // run has finished
	err      error         // why run stopped short
}

// partWritten is the progress of one connection of a round.
type partWritten struct {
	registry.Span
	written int64
}

// fetchBlob starts the download of blob d (size bytes) and returns its
// content as a stream that ends with the digest check of the whole blob.
// While it waits for the blob's partial file, held by a download from the
// same source, that download's pull's progress is this pull's: one that
// stalls stalls this pull too, and its wait for a download slot does not.
// Waiting for a download slot is not a stall of the pull.
func (s *Service) fetchBlob(ctx context.Context, blobs *registry.Blobs, d digest.Digest, size int64, watch *progressWatch) (io.ReadCloser, error) {
	if size <= 0 {
		return nil, fmt.Errorf("blob %s: its descriptor says %d bytes", d, size)
	}
	// The partial file is bounded by the blob's size: a blob bigger than
	// a layer may unpack to is refused before a byte is written (its
	// parts would be written ahead of the unpacker, which bounds the rest).
	if max := s.opts.MaxLayerBytes; max > 0 && size > max {
		return nil, fmt.Errorf("%w: blob %s: its descriptor says %d bytes, more than %d", unpack.ErrTooLarge, d, size, max)
	}
	file, err := s.content.OpenPartial(ctx, d, size, content.Downloader{Source: blobs.Source(), Clock: &watch.last, Progressed: s.following(d, watch)})
	if err != nil {
		return nil, err
	}
	if s.downloads.tryAcquire(1) == 0 {
		s.log.Debug("waiting for a download slot", "blob", d)
		watch.waiting.Add(1)
		err = s.downloads.acquire(ctx)
		watch.waiting.Add(-1)
	}
	if err != nil {
		file.Close()
		return nil, err
	}
	watch.touch() // the wait was not the pull's stall
	watch.active.Add(1)
	dctx, cancel := context.WithCancelCause(ctx)
	dl := &download{pullCtx: ctx, blobs: blobs, digest: d, size: size, file: file, slots: s.downloads,
		cancel: cancel, ended: make(chan struct{}), complete: file.Offset(), saved: file.Offset()}
	dl.cond = sync.NewCond(&dl.mu)
	if dl.complete > 0 {
		s.log.Info("resuming download", "blob", d, "from", dl.complete, "size", size)
	}
	go func() {
		defer watch.active.Add(-1)
		dl.run(dctx)
	}()
	return &blobReader{dl: dl, hash: d.Algorithm().Hash()}, nil
}

// following is the progress of a pull whose download of blob d waits for
// the blob's partial file, held by another pull's download: each move of
// that download's clock is this pull's progress. The first is logged.
func (s *Service) following(d digest.Digest, watch *progressWatch) func() {
	var once sync.Once
	return func() {
		once.Do(func() { s.log.Debug("following another pull's download of a blob", "blob", d) })
		watch.touch()
	}
}

// run downloads until the blob is complete or a round fails in a way a
// retry would not mend.
func (dl *download) run(ctx context.Context) {
	defer close(dl.ended)
	defer dl.slots.release(1)
	rangesRefused := false
	stalls := 0
	var err error
	for dl.completed() < dl.size {
		before := dl.completed()
		// A range asks for the rest, or finds out whether a big layer
		// can be split; a registry that refused one gets none again.
		ranged := !rangesRefused && (before > 0 || dl.size >= rangedLayerMin)
		if err = dl.round(ctx, ranged); err == nil {
			continue
		}
		if ctx.Err() != nil {
			err = context.Cause(ctx)
			break
		}
		if errors.Is(err, registry.ErrRangeRefused) {
			// What was downloaded may be of another blob: start over.
			dl.restart()
			rangesRefused = true
			continue
		}
		if !isTransferCut(err) {
			break
		}
		if dl.completed() > before {
			stalls = 0
		} else if stalls++; stalls >= maxStalledRetries {
			break
		}
	}
	if dl.completed() == dl.size {
		err = nil
	}
	dl.mu.Lock()
	dl.err, dl.done = err, true
	dl.cond.Broadcast()
	dl.mu.Unlock()
}

func (dl *download) completed() int64 {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return dl.complete
}

// restart forgets what was downloaded: the next bytes written start at 0.
func (dl *download) restart() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.complete, dl.parts = 0, nil
	dl.checkpoint()
}

// round asks for the rest of the blob; when the registry answers with a
// range and the layer is big, it splits the rest between that connection
// and as many more as there are free download slots.
func (dl *download) round(ctx context.Context, ranged bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	left := registry.Span{Start: dl.completed(), End: dl.size}
	body, err := dl.blobs.Get(ctx, dl.digest.String(), dl.size, left, ranged)
	if err != nil {
		return cutIfNetwork(err)
	}
	if body.Span != left { // the whole blob, for a range: start over
		dl.restart()
		left = body.Span
	}
	parts := []registry.Span{left}
	if body.Ranged && dl.size >= rangedLayerMin {
		extra := dl.slots.tryAcquire(rangeConnections - 1)
		parts = registry.PlanParts(left, 1+extra, minRangePart)
		dl.slots.release(extra - (len(parts) - 1))
		defer dl.slots.release(len(parts) - 1)
	}
	dl.mu.Lock()
	dl.parts = make([]partWritten, len(parts))
	for i, p := range parts {
		dl.parts[i].Span = p
	}
	dl.mu.Unlock()

	var g errgroup.Group
	run := func(f func() error) {
		g.Go(func() error {
			err := f()
			if err != nil {
				cancel(err) // the other connections stop too
			}
			return err
		})
	}
	if len(parts) == 1 {
		run(func() error { return dl.copyPart(0, body) }) // run retries it
	} else {
		// The first part's connection is open; the others open theirs.
		opened := make([]*registry.BlobBody, len(parts))
		opened[0] = body
		for i := range parts {
			run(func() error { return dl.fetchPart(ctx, i, opened[i]) })
		}
	}
	if g.Wait() != nil {
		// The first failure cancelled the other connections: report it,
		// not the cancellation one of them saw.
		return context.Cause(ctx)
	}
	return nil
}

// fetchPart fetches part i of a split round (on body, if open), asking
// again for what is missing of it when its connection is cut, while the
// other parts go on: one bad connection does not cost the others' bytes.
func (dl *download) fetchPart(ctx context.Context, i int, body *registry.BlobBody) error {
	stalls := 0
	for {
		before := dl.partRest(i)
		err := dl.copyPartFrom(ctx, i, body)
		body = nil
		if err == nil || !isTransferCut(err) || ctx.Err() != nil {
			return err
		}
		if dl.partRest(i).Start > before.Start {
			stalls = 0
		} else if stalls++; stalls >= maxStalledRetries {
			return err
		}
	}
}

// partRest is what part i still misses.
func (dl *download) partRest(i int) registry.Span {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	p := dl.parts[i]
	return registry.Span{Start: p.Start + p.written, End: p.End}
}

// copyPartFrom copies the rest of part i from body, or from a new ranged
// request for it when body is nil.
func (dl *download) copyPartFrom(ctx context.Context, i int, body *registry.BlobBody) error {
	if body == nil {
		rest := dl.partRest(i)
		b, err := dl.blobs.Get(ctx, dl.digest.String(), dl.size, rest, true)
		if err != nil {
			return cutIfNetwork(err)
		}
		if b.Span != rest {
			b.Close()
			return fmt.Errorf("%w: the registry answered one range and not the next", registry.ErrRangeRefused)
		}
		body = b
	}
	return dl.copyPart(i, body)
}

// copyPart writes the rest of part i's bytes from body, which starts
// there, into the file at their offsets. The body may carry more than the
// part (the first connection of a split round asked for all the rest):
// the part ends where the next begins.
func (dl *download) copyPart(i int, body *registry.BlobBody) error {
	defer body.Close()
	buf := make([]byte, 256<<10)
	span := dl.partRest(i)
	for at := span.Start; at < span.End; {
		n, err := body.Read(buf[:min(int64(len(buf)), span.End-at)])
		if n > 0 {
			if _, werr := dl.file.WriteAt(buf[:n], at); werr != nil {
				return werr
			}
			at += int64(n)
			dl.wrote(i, int64(n))
		}
		if err == io.EOF && at < span.End {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			return transferCut{err}
		}
	}
	return nil
}

// wrote records n more bytes of part i and moves the complete prefix.
func (dl *download) wrote(i int, n int64) {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.parts[i].written += n
	c := dl.parts[0].Start
	for _, p := range dl.parts {
		c += p.written
		if p.written < p.Len() {
			break
		}
	}
	if c != dl.complete {
		dl.complete = c
		dl.cond.Broadcast()
	}
	if dl.complete-dl.saved >= checkpointEvery || dl.complete == dl.size {
		dl.checkpoint()
	}
}

// checkpoint records the complete prefix for the next attempt; mu is held.
// A record that fails costs only a longer download next time.
func (dl *download) checkpoint() {
	if dl.file.Checkpoint(dl.complete) == nil {
		dl.saved = dl.complete
	}
}

// transferCut is a connection that broke in the middle of a body, or did
// not connect: a retry asks for the rest.
type transferCut struct{ err error }

func (e transferCut) Error() string { return "transfer cut: " + e.err.Error() }
func (e transferCut) Unwrap() error { return e.err }

func isTransferCut(err error) bool {
	var c transferCut
	return errors.As(err, &c)
}

// cutIfNetwork marks a request that failed in the network as cut; the
// registry's answers (statuses, bad headers) and the redirect bound are not
// something a retry mends.
func cutIfNetwork(err error) error {
	// net/http wraps every failure of a request in a *url.Error, itself a
	// net.Error: look at what it wraps (a refused redirect, the redirect
	// bound or a TLS failure is not a network cut).
	inner := err
	var ue *url.Error
	if errors.As(err, &ue) {
		inner = ue.Err
	}
	var ne net.Error
	if errors.As(inner, &ne) || errors.Is(inner, io.ErrUnexpectedEOF) || errors.Is(inner, syscall.ECONNRESET) {
		return transferCut{err}
	}
	return err
}

// errBlobDigestMismatch is returned (wrapped) for a downloaded blob whose
// content is not what its digest names.
var errBlobDigestMismatch = errors.New("digest mismatch")

// blobReader hands out the download's complete prefix in order, and checks
// the digest of the whole blob at its end.
type blobReader struct {
	dl       *download
	hash     hash.Hash
	off      int64
	verified bool  // the whole blob was read and matched its digest
	bad      bool  // the whole blob was read and did not
	readErr  error // the error a read returned, but io.EOF
}

func (r *blobReader) Read(p []byte) (int, error) {
	n, err := r.read(p)
	if err != nil && err != io.EOF {
		r.readErr = err
	}
	return n, err
}

func (r *blobReader) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	dl := r.dl
	dl.mu.Lock()
	for dl.complete <= r.off && r.off < dl.size && !dl.done {
		dl.cond.Wait()
	}
	avail, err := dl.complete-r.off, dl.err
	dl.mu.Unlock()
	switch {
	case avail > 0:
		n, err := dl.file.ReadAt(p[:min(int64(len(p)), avail)], r.off)
		r.hash.Write(p[:n])
		r.off += int64(n)
		if err == io.EOF {
			err = nil // the complete prefix is in the file, whatever its size says
		}
		return n, err
	case r.off < dl.size:
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return 0, fmt.Errorf("blob %s: %w", dl.digest, err)
	}
	if got := digest.NewDigest(dl.digest.Algorithm(), r.hash); got != dl.digest {
		r.bad = true
		return 0, fmt.Errorf("blob %s: %w: downloaded content has digest %s", dl.digest, errBlobDigestMismatch, got)
	}
	r.verified = true
	return 0, io.EOF
}

// Close stops the download and decides what becomes of its file. A blob
// read to its end goes: it is unpacked, or it failed its digest. So does
// one whose reader stopped on its own, without a failed read or a
// cancelled pull: the decompressor or the unpacker refused its bytes, which
// may be corrupt. Otherwise (the network or the pull stopped it) the file
// stays for the next attempt, up to its complete prefix.
func (r *blobReader) Close() error {
	r.dl.cancel(errors.New("blob reader closed"))
	<-r.dl.ended
	if r.verified || r.bad || (r.readErr == nil && r.dl.pullCtx.Err() == nil) {
		return r.dl.file.Remove()
	}
	r.dl.mu.Lock()
	r.dl.checkpoint()
	r.dl.mu.Unlock()
	return r.dl.file.Close()
}
