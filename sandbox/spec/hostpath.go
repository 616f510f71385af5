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

// maxHungLookupsPerPod bounds the lookups one pod has unanswered at
// once. A lookup stuck in the kernel cannot be cancelled: its goroutine
// (and thread) stays until the filesystem answers. Callers looking at a
// path whose lookup is under way share it, so these are at most one per
// path. The bound is the pod's, never the node's: a pod whose volumes sit
// on a hung server must not keep every other pod's host paths (the
// kubelet's etc-hosts and termination-log among them) from being looked at.
const maxHungLookupsPerPod = 16

// hostLookup is one look at a host path, shared by every caller that asks
// for the path while it is under way (pods mounting one host folder). It
// counts against the pod that started it.
type hostLookup struct {
	started  time.Time
	pod      *podLookups
	done     chan struct{} // closed once the fields below are set
	resolved string
	fi       os.FileInfo
	err      error
}

// podLookups counts one pod's lookups that have not answered yet.
type podLookups struct{ unanswered int }

// hostLookups are the host paths whose lookup has not answered yet, and
// the pods with such lookups. A pod is in pods only while it has one (or
// until ForgetPod), so the map does not grow with the pods a node has run.
var hostLookups = struct {
	sync.Mutex
	paths map[string]*hostLookup
	pods  map[string]*podLookups
}{paths: map[string]*hostLookup{}, pods: map[string]*podLookups{}}

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
	owner := hostLookups.pods[pod]
	if owner == nil {
		owner = &podLookups{}
		hostLookups.pods[pod] = owner
	}
	if owner.unanswered >= maxHungLookupsPerPod {
		return nil, errkind.Errorf(errkind.ResourceExhausted, "%s %q: not looked at while lookups of %d other host paths of pod %s have no answer",
			field, p, maxHungLookupsPerPod, pod)
	}
	owner.unanswered++
	l := &hostLookup{started: time.Now(), pod: owner, done: make(chan struct{})}
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
		l.pod.unanswered--
		if l.pod.unanswered == 0 && hostLookups.pods[pod] == l.pod {
			delete(hostLookups.pods, pod)
		}
		hostLookups.Unlock()
		close(l.done)
	}()
	return l, nil
}

// ForgetPod drops the count of a removed pod's unanswered lookups: its ID
// never asks again. Its lookups still hung go when they answer.
func ForgetPod(pod string) {
	hostLookups.Lock()
	defer hostLookups.Unlock()
	delete(hostLookups.pods, pod)
}
