package spec

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
)

// hostPathTimeout bounds the look at a volume's or device's host path: a
// hung NFS server or FUSE daemon would otherwise hold CreateContainer (and
// the pod's lock) until the kubelet's own timeout, and the next call after
// it, for ever. A var for tests.
var hostPathTimeout = 10 * time.Second

// maxHungLookups bounds the lookups still hanging at once. A lookup stuck
// in the kernel cannot be cancelled: its goroutine (and thread) stays until
// the filesystem answers. A path whose last lookup still hangs is not
// looked at again, so these are at most one per hung path, and no more than
// this many on the node.
const maxHungLookups = 16

// hungLookups are the host paths whose lookup has not returned yet.
var hungLookups = struct {
	sync.Mutex
	paths map[string]bool
}{paths: map[string]bool{}}

// resolveHostPath resolves the symlinks of host path p, named by field
// ("mount /data: host_path"), and stats what it names, within
// hostPathTimeout. Errors say whose fault it is (errkind): a missing path
// is the caller's, a filesystem that fails or hangs the node's.
func resolveHostPath(field, p string) (string, os.FileInfo, error) {
	type result struct {
		resolved string
		fi       os.FileInfo
		err      error
	}
	hungLookups.Lock()
	switch {
	case hungLookups.paths[p]:
		hungLookups.Unlock()
		return "", nil, errkind.Errorf(errkind.DeadlineExceeded, "%s %q: an earlier lookup of it has had no answer from its filesystem for over %v (a hung NFS or FUSE mount?)",
			field, p, hostPathTimeout)
	case len(hungLookups.paths) >= maxHungLookups:
		hungLookups.Unlock()
		return "", nil, errkind.Errorf(errkind.ResourceExhausted, "%s %q: not looked at while %d other host paths hang", field, p, maxHungLookups)
	}
	hungLookups.paths[p] = true
	hungLookups.Unlock()

	done := make(chan result, 1)
	go func() {
		var r result
		r.resolved, r.err = filepath.EvalSymlinks(p)
		if r.err == nil {
			r.fi, r.err = os.Stat(r.resolved)
		}
		// Forgotten before the answer goes out: once the caller has it, the
		// next look at p (a second mount of it) must not find it hanging.
		hungLookups.Lock()
		delete(hungLookups.paths, p)
		hungLookups.Unlock()
		done <- r
	}()
	timer := time.NewTimer(hostPathTimeout)
	defer timer.Stop()
	select {
	case r := <-done:
		switch {
		case errors.Is(r.err, os.ErrNotExist):
			return "", nil, errkind.Errorf(errkind.Invalid, "%s %q does not exist", field, p)
		case r.err != nil:
			return "", nil, errkind.PathErrorf(r.err, "%s %q: %w", field, p, r.err)
		}
		return r.resolved, r.fi, nil
	case <-timer.C:
		return "", nil, errkind.Errorf(errkind.DeadlineExceeded, "%s %q: no answer from its filesystem within %v (a hung NFS or FUSE mount?)",
			field, p, hostPathTimeout)
	}
}
