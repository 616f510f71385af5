package spec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
)

// hostPathTimeout bounds the look at a volume's or device's host path: a
// hung NFS server or FUSE daemon would otherwise hold CreateContainer (and
// the pod's lock) until the kubelet's own timeout, and the next call after
// it, for ever. berthd's host_path_timeout (SetHostPathTimeout).
var hostPathTimeout = 10 * time.Second

// SetHostPathTimeout sets the bound on each look at a host path. It is the
// node's, as the lookups under way are: set once, before any container is
// created.
func SetHostPathTimeout(d time.Duration) { hostPathTimeout = d }

// maxHungLookupsPerPod bounds the lookups one pod has unanswered at
// once. A lookup stuck in the kernel cannot be cancelled: its goroutine
// (and thread) stays until the filesystem answers. Callers looking at a
// path whose lookup is under way share it, so these are at most one per
// path. The bound is the pod's, never the node's: a pod whose volumes sit
// on a hung server must not keep every other pod's host paths (the
// kubelet's etc-hosts and termination-log among them) from being looked at.
const maxHungLookupsPerPod = 16

// maxHungLookups bounds the unanswered lookups of the node, far above any
// one pod's: each holds an OS thread in the kernel, and berthd dies at
// Go's 10000 threads. Pods of a CronJob on a dead NFS server, each with
// its own volume paths, would otherwise add threads without end; removing
// a pod does not end its lookups.
const maxHungLookups = 1024

// hostLookup is one look at a host path, shared by every caller that asks
// for the path while it is under way (pods mounting one host folder). It
// counts against the pod that started it.
type hostLookup struct {
	started  time.Time
	pod      string
	done     chan struct{} // closed once the fields below are set
	resolved string
	fi       os.FileInfo
	err      error
}

// hostLookups are the host paths whose lookup has not answered yet: a few
// at most on a healthy node, maxHungLookups on the sickest.
var hostLookups = struct {
	sync.Mutex
	paths map[string]*hostLookup
}{paths: map[string]*hostLookup{}}

// resolveHostPath resolves the symlinks of host path p, named by field
// ("mount /data: host_path"), for the pod whose ID is pod, and stats what
// it names, within hostPathTimeout. Errors say whose fault it is
// (errkind): a missing path is the caller's, a filesystem that fails or
// hangs the node's.
func resolveHostPath(pod, field, p string) (string, os.FileInfo, error) {
	l, err := lookUpHostPath(pod, field, p)
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

// lookUpHostPath starts the lookup of p for pod, or joins the one under
// way, whichever pod started it. A lookup already past hostPathTimeout is
// not waited for again: the caller learns at once that p hangs.
func lookUpHostPath(pod, field, p string) (*hostLookup, error) {
	hostLookups.Lock()
	defer hostLookups.Unlock()
	if l := hostLookups.paths[p]; l != nil {
		if time.Since(l.started) >= hostPathTimeout {
			return nil, errkind.Errorf(errkind.DeadlineExceeded, "%s %q: an earlier lookup of it has had no answer from its filesystem for over %v (a hung NFS or FUSE mount?)",
				field, p, hostPathTimeout)
		}
		return l, nil
	}
	if err := roomForLookup(pod); err != nil {
		return nil, errkind.Errorf(errkind.ResourceExhausted, "%s %q: not looked at while %v", field, p, err)
	}
	l := &hostLookup{started: time.Now(), pod: pod, done: make(chan struct{})}
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

// roomForLookup says why pod may not start another lookup, if it may
// not; hostLookups is locked.
func roomForLookup(pod string) error {
	if len(hostLookups.paths) >= maxHungLookups {
		return fmt.Errorf("lookups of %d host paths of the node have no answer", maxHungLookups)
	}
	n := 0
	for _, l := range hostLookups.paths {
		if l.pod == pod {
			n++
		}
	}
	if n >= maxHungLookupsPerPod {
		return fmt.Errorf("lookups of %d other host paths of pod %s have no answer", n, pod)
	}
	return nil
}
