package image

import (
	"errors"
	"time"

	"github.com/berth-runtime/berth/image/content"
	"github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"
)

// gcDebounce is how long a collection waits after being asked for, so that a
// burst of removals (a pod's containers, a kubelet image GC pass) costs one.
const gcDebounce = 200 * time.Millisecond

// hold pins snapshots (by chain ID) and blobs (by digest) that an operation in
// progress is about to reference, so that no collection removes them in the
// meantime. It waits while a collection is removing one of them (the caller
// then finds it gone and makes it again), and returns the release. Holds are
// in memory and short: they cover one pull's layers from its config to its
// image record, or one Lease's check and record, never a lock across a
// download.
func (s *Service) hold(keys ...string) (release func()) {
	s.holdMu.Lock()
	for s.anyRemoving(keys) {
		s.holdCond.Wait()
	}
	for _, k := range keys {
		s.held[k]++
	}
	s.holdMu.Unlock()
	return func() {
		s.holdMu.Lock()
		defer s.holdMu.Unlock()
		for _, k := range keys {
			if s.held[k]--; s.held[k] <= 0 {
				delete(s.held, k)
			}
		}
	}
}

func (s *Service) anyRemoving(keys []string) bool {
	for _, k := range keys {
		if s.removing[k] {
			return true
		}
	}
	return false
}

// requestGC asks the background collector for a collection soon. It never
// blocks: requests during a pending one are folded into it.
func (s *Service) requestGC() {
	s.wakeGC()
}

// requestGCFreeingPartials asks for a collection that also removes the
// partial downloads no pull is writing, whatever their age: the node
// wants its space back (the kubelet's image GC removes images; a pull ran
// out of space).
func (s *Service) requestGCFreeingPartials() {
	s.freePartials.Store(true)
	s.wakeGC()
}

func (s *Service) wakeGC() {
	select {
	case s.gcWake <- struct{}{}:
	default:
	}
}

// gcLoop runs collections off the request path until Close.
func (s *Service) gcLoop() {
	defer close(s.gcDone)
	for {
		select {
		case <-s.gcStop:
			return
		case <-s.gcWake:
		}
		select {
		case <-s.gcStop:
			return
		case <-time.After(gcDebounce):
		}
		select { // requests made during the wait are served by this collection
		case <-s.gcWake:
		default:
		}
		if err := s.collectGarbage(); err != nil {
			s.log.Error("collect unused layers and blobs", "err", err)
		}
	}
}

// Close stops the background collector (collections under way finish
// first), then makes the unpacked layers durable.
func (s *Service) Close() {
	s.closeOnce.Do(func() {
		close(s.gcStop)
		<-s.gcDone
		s.closeLazy()
		s.snaps.Close()
	})
}

// collectGarbage removes snapshots and blobs that no image, lease or hold
// references, and the partial downloads no pull is writing that are older
// than content.PartialMaxAge, or all of them when asked to free them.
func (s *Service) collectGarbage() error {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	snaps, err := s.snaps.List()
	if err != nil {
		return err
	}
	blobs, err := s.content.List()
	if err != nil {
		return err
	}
	candidates := make([]string, 0, len(snaps)+len(blobs))
	for _, snap := range snaps {
		candidates = append(candidates, snap.ChainID)
	}
	isBlob := map[string]bool{}
	for _, d := range blobs {
		candidates = append(candidates, d.String())
		isBlob[d.String()] = true
	}
	doomed, err := s.pickGarbage(candidates)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range doomed {
		if isBlob[k] {
			errs = append(errs, s.content.Delete(digest.Digest(k)))
		} else {
			errs = append(errs, s.removeSnapshot(k))
		}
	}
	s.holdMu.Lock()
	for _, k := range doomed {
		delete(s.removing, k)
	}
	s.holdCond.Broadcast()
	s.holdMu.Unlock()
	partialAge := content.PartialMaxAge
	if s.freePartials.Swap(false) {
		partialAge = 0
	}
	errs = append(errs, s.content.RemoveStalePartials(partialAge))
	return errors.Join(errs...)
}

// pickGarbage chooses, among candidates, what no image, lease or hold
// references, and marks it as being removed. References are read under
// holdMu: a pull records its image before it drops its holds, so every
// reference is either in the records read here or in a hold. The reads (a
// bbolt view of the leases, memory-mapped, and the images in memory) are
// the only work done under holdMu.
func (s *Service) pickGarbage(candidates []string) ([]string, error) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	var used map[string]bool
	err := s.opts.DB.View(func(tx *bolt.Tx) (err error) {
		used, err = leasedChainIDs(tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, img := range s.images.all(nil) {
		for _, k := range img.references() {
			used[k] = true
		}
	}
	var doomed []string
	for _, k := range candidates {
		if !used[k] && s.held[k] == 0 {
			s.removing[k] = true
			doomed = append(doomed, k)
		}
	}
	return doomed, nil
}
