package store

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	bolt "go.etcd.io/bbolt"
)

// view is every pod and container in memory: their records, decoded once
// and written through to bolt, and each container's live state, fed by its
// shim's events and by the replies of berthd's own calls. Reads never
// touch the database or a shim. Its pods and container statuses are never
// changed once stored, only replaced: the lists hand them out shared, with
// nothing copied (the kubelet lists every pod and container each second),
// while pod and container hand out copies that callers change and save.
type view struct {
	mu    sync.RWMutex
	pods  map[string]*Pod
	ctrs  map[string]*ctrEntry
	byPod map[string]map[string]bool // pod ID → its container IDs
	// version changes with every change of a pod or container (see
	// Store.Version).
	version atomic.Uint64
}

// ctrEntry is a container's record and live state, and the status made
// of the two, rebuilt when either changes.
type ctrEntry struct {
	c      *Container
	st     shim.State
	status *ContainerStatus
}

func newView() *view {
	return &view{pods: map[string]*Pod{}, ctrs: map[string]*ctrEntry{}, byPod: map[string]map[string]bool{}}
}

// load fills the view from bolt at start; containers are created until
// their shim or exit records say otherwise.
func (v *view) load(tx *bolt.Tx) error {
	err := tx.Bucket(podsBucket).ForEach(func(_, b []byte) error {
		p, err := decodePod(b)
		if err == nil {
			v.setPod(p)
		}
		return err
	})
	if err != nil {
		return err
	}
	return tx.Bucket(containersBucket).ForEach(func(_, b []byte) error {
		c, err := decodeContainer(b)
		if err == nil {
			v.setContainer(c)
		}
		return err
	})
}

// ClonePod is a copy of p to change and save: what ListPods hands out is
// shared.
func ClonePod(p *Pod) *Pod {
	c := *p
	c.AdditionalIPs = slices.Clone(p.AdditionalIPs)
	c.Pins = maps.Clone(p.Pins)
	c.Files = maps.Clone(p.Files)
	c.Timeline = slices.Clone(p.Timeline)
	return &c
}

func cloneContainer(c *Container) *Container {
	o := *c
	o.Timeline = slices.Clone(c.Timeline)
	return &o
}

func (v *view) setPod(p *Pod) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pods[p.ID] = ClonePod(p)
	v.version.Add(1)
}

func (v *view) deletePod(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.pods, id)
	v.version.Add(1)
}

// setContainer records c; a new container starts as created, the state
// CRI shows while it is being made.
func (v *view) setContainer(c *Container) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.ctrs[c.ID]
	if e == nil {
		e = &ctrEntry{st: shim.State{ID: c.ID, Status: shim.StatusCreated}}
		v.ctrs[c.ID] = e
		if v.byPod[c.PodID] == nil {
			v.byPod[c.PodID] = map[string]bool{}
		}
		v.byPod[c.PodID][c.ID] = true
	}
	e.c = cloneContainer(c)
	e.status = statusOf(e.c, e.st)
	v.version.Add(1)
}

func (v *view) deleteContainer(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.ctrs[id]
	if e == nil {
		return
	}
	delete(v.ctrs, id)
	v.version.Add(1)
	if delete(v.byPod[e.c.PodID], id); len(v.byPod[e.c.PodID]) == 0 {
		delete(v.byPod, e.c.PodID)
	}
}

// statusRank orders container statuses: a state never goes back, whatever
// order the shim's events and berthd's replies arrive in.
var statusRank = map[string]int{shim.StatusCreated: 0, shim.StatusRunning: 1, shim.StatusStopped: 2}

// setState records a container's live state unless it is older than the
// one known or the same (a shim's snapshot after berthd's restart repeats
// every state: the version, and with it the kept lists, stays), and
// reports whether its status changed.
func (v *view) setState(st shim.State) (changed bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.ctrs[st.ID]
	if e == nil || statusRank[st.Status] < statusRank[e.st.Status] || st == e.st {
		return false
	}
	changed = st.Status != e.st.Status
	e.st = st
	e.status = statusOf(e.c, st)
	v.version.Add(1)
	return changed
}

// pod returns the pod whose ID is id, or the only one whose ID starts with
// it.
func (v *view) pod(id string) (*Pod, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	id, err := findID(v.pods, "pod", id)
	if err != nil {
		return nil, err
	}
	return ClonePod(v.pods[id]), nil
}

func (v *view) container(id string) (*Container, shim.State, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	id, err := findID(v.ctrs, "container", id)
	if err != nil {
		return nil, shim.State{}, err
	}
	e := v.ctrs[id]
	return cloneContainer(e.c), e.st, nil
}

// findID resolves a full ID or a unique prefix among the keys of m.
func findID[T any](m map[string]T, kind, id string) (string, error) {
	if id == "" {
		return "", errkind.Errorf(errkind.Invalid, "%s ID is required", kind)
	}
	if _, ok := m[id]; ok {
		return id, nil
	}
	found := ""
	for k := range m {
		if strings.HasPrefix(k, id) {
			if found != "" {
				return "", errkind.Errorf(errkind.Invalid, "%s ID %q is ambiguous: it begins %s and %s", kind, id, found, k)
			}
			found = k
		}
	}
	if found == "" {
		return "", errkind.Errorf(errkind.NotFound, "%s %q", kind, id)
	}
	return found, nil
}

// listPods returns the pods f selects, shared: read-only; f.ID is a full
// ID.
func (v *view) listPods(f Filter) []*Pod {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]*Pod, 0, len(v.pods))
	for _, p := range v.pods {
		if f.SelectsAll() || f.matches(p.ID, p.Config.Labels, int32(p.State)) {
			out = append(out, p)
		}
	}
	return out
}

// listStatuses returns the statuses of the containers f selects, shared:
// read-only; f.ID and f.PodID are full IDs.
func (v *view) listStatuses(f Filter) []*ContainerStatus {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n := len(v.ctrs)
	if f.PodID != "" {
		n = len(v.byPod[f.PodID])
	}
	out := make([]*ContainerStatus, 0, n)
	add := func(e *ctrEntry) {
		if s := e.status; f.SelectsAll() || f.matches(s.ID, s.Config.Labels, int32(s.State)) {
			out = append(out, s)
		}
	}
	if f.PodID == "" {
		for _, e := range v.ctrs {
			add(e)
		}
	} else {
		for id := range v.byPod[f.PodID] {
			add(v.ctrs[id])
		}
	}
	return out
}

// containersOf returns copies of the records of pod podID's containers
// (every pod's when empty).
func (v *view) containersOf(podID string) []*Container {
	ctrs, _ := v.listContainers(podID)
	return ctrs
}

// listContainers returns copies of the records of pod podID's containers
// (every pod's when empty) and their states.
func (v *view) listContainers(podID string) ([]*Container, []shim.State) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var ids []string
	if podID == "" {
		ids = slices.Collect(maps.Keys(v.ctrs))
	} else {
		ids = slices.Collect(maps.Keys(v.byPod[podID]))
	}
	ctrs, states := make([]*Container, len(ids)), make([]shim.State, len(ids))
	for i, id := range ids {
		e := v.ctrs[id]
		ctrs[i], states[i] = cloneContainer(e.c), e.st
	}
	return ctrs, states
}
