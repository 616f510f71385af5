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

// maxHungLookups bounds the lookups unanswered at once. A lookup stuck in
// the kernel cannot be cancelled: its goroutine (and thread) stays until
// the filesystem answers. Callers looking at a path whose lookup is under
// way share it, so these are at most one per path, and no more than this
// many on the node.
const maxHungLookups = 16

// hostLookup is one look at a host path, shared by every caller that asks
// for the path while it is under way (pods mounting one host folder).
type hostLookup struct {
	started  time.Time
	done     chan struct{} // closed once the fields below are set
	resolved string
	fi       os.FileInfo
	err      error
}

// hostLookups are the host paths whose lookup has not answered yet.
var hostLookups = struct {
	sync.Mutex
	paths map[string]*hostLookup
}{paths: map[string]*hostLookup{}}

// resolveHostPath resolves the symlinks of host path p, named by field
// ("mount /data: host_path"), and stats what it names, within
// hostPathTimeout. Errors say whose fault it is (errkind): a missing path
// is the caller's, a filesystem that fails or hangs the node's.
func resolveHostPath(field, p string) (string, os.FileInfo, error) {
	l, err := lookUpHostPath(field, p)
	if err != nil {
		return "", nil, err
	}
	timer := time.NewTimer(hostPathTimeout - time.Since(l.started))
	defer timer.Stop()
	select {
	case <-l.done:
		switch {
		case errors.Is(l.err, os.ErrNotExist):
			return "", nil, errkind.Errorf(errkind.Invalid, "%s %q does not exist", field, p)
		case l.err != nil:
			return "", nil, errkind.PathErrorf(l.err, "%s %q: %w", field, p, l.err)
		}
		return l.resolved, l.fi, nil
	case <-timer.C:
		return "", nil, errkind.Errorf(errkind.DeadlineExceeded, "%s %q: no answer from its filesystem within %v (a hung NFS or FUSE mount?)",
			field, p, hostPathTimeout)
	}
}

// lookUpHostPath starts the lookup of p, or joins the one under way. A
// lookup already past hostPathTimeout is not waited for again: the caller
// learns at once that p hangs.
func lookUpHostPath(field, p string) (*hostLookup, error) {
	hostLookups.Lock()
	defer hostLookups.Unlock()
	if l := hostLookups.paths[p]; l != nil {
		if time.Since(l.started) >= hostPathTimeout {
			return nil, errkind.Errorf(errkind.DeadlineExceeded, "%s %q: an earlier lookup of it has had no answer from its filesystem for over %v (a hung NFS or FUSE mount?)",
				field, p, hostPathTimeout)
		}
		return l, nil
	}
	if len(hostLookups.paths) >= maxHungLookups {
		return nil, errkind.Errorf(errkind.ResourceExhausted, "%s %q: not looked at while lookups of %d other host paths have no answer", field, p, maxHungLookups)
	}
	l := &hostLookup{started: time.Now(), done: make(chan struct{})}
	hostLookups.paths[p] = l
	go func() {
		l.resolved, l.err = filepath.EvalSymlinks(p)
		if l.err == nil {
			l.fi, l.err = os.Stat(l.resolved)
		}
		// Forgotten before the answer goes out: once a caller has it, the
		// next look at p (a second mount of it) starts afresh.
		hostLookups.Lock()
		delete(hostLookups.paths, p)
		hostLookups.Unlock()
		close(l.done)
	}()
	return l, nil
}
