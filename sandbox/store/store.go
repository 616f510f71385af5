// Package store keeps berth's pods and containers: their durable records
// in bolt, the in-memory view every read is served from, the filters of the
// CRI list calls, and the events that tell subscribers of each change. It
// knows nothing of how a pod is run: the lifecycle (package sandbox) asks
// it, and writes through it, and never reaches into its maps.
package store

import (
	"github.com/berth-runtime/berth/sandbox/shim"
	bolt "go.etcd.io/bbolt"
)

// Store is the records of pods and containers, written through to bolt,
// and each container's live state.
type Store struct {
	db     *bolt.DB
	view   *view
	events eventHub
}

// Open makes the buckets the records live in, if new, and loads the view
// from them.
func Open(db *bolt.DB) (*Store, error) {
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{podsBucket, containersBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	s := &Store{db: db, view: newView()}
	if err := db.View(s.view.load); err != nil {
		return nil, err
	}
	return s, nil
}

// SavePod writes the pod's record, then its view.
func (s *Store) SavePod(p *Pod) error {
	if err := s.db.Update(func(tx *bolt.Tx) error { return putPod(tx, p) }); err != nil {
		return err
	}
	s.view.setPod(p)
	return nil
}

// DeletePod removes the pod's record and view.
func (s *Store) DeletePod(id string) error {
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(podsBucket).Delete([]byte(id)) }); err != nil {
		return err
	}
	s.view.deletePod(id)
	return nil
}

// SaveContainer writes the container's record, then its view.
func (s *Store) SaveContainer(c *Container) error {
	if err := s.db.Update(func(tx *bolt.Tx) error { return putContainer(tx, c) }); err != nil {
		return err
	}
	s.view.setContainer(c)
	return nil
}

// DeleteContainer removes the container's record and view.
func (s *Store) DeleteContainer(id string) error {
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(containersBucket).Delete([]byte(id)) }); err != nil {
		return err
	}
	s.view.deleteContainer(id)
	return nil
}

// SetState records a container's live state, as its shim or berthd's own
// call reported it, unless it is older than the one known or the same, and
// reports whether its status changed.
func (s *Store) SetState(st shim.State) (changed bool) { return s.view.setState(st) }

// Version changes with every change of a pod or container: a node-wide
// list made at one version (cri keeps it, encoded) is the answer until it
// changes, while the kubelet lists every pod and container each second.
func (s *Store) Version() uint64 { return s.view.version.Load() }

// Pod returns a copy of the pod whose ID is id, or of the only one whose
// ID starts with it (CLI users type short IDs), to change and save; or an
// error wrapping errkind.NotFound or, for a prefix of several,
// errkind.Invalid.
func (s *Store) Pod(id string) (*Pod, error) { return s.view.pod(id) }

// Container returns a copy of the container's record, found as Pod finds a
// pod, and its live state.
func (s *Store) Container(id string) (*Container, shim.State, error) { return s.view.container(id) }

// Status returns the container's status, found as Pod finds a pod: one of
// its own, not shared with the lists, for the caller to complete.
func (s *Store) Status(id string) (*ContainerStatus, error) {
	c, st, err := s.view.container(id)
	if err != nil {
		return nil, err
	}
	return statusOf(c, st), nil
}

// ListPods returns the pods f selects. They are shared with every other
// caller, and read-only: Pod gives a copy to change.
func (s *Store) ListPods(f Filter) ([]*Pod, error) {
	found, err := resolve(&f.ID, s.podID)
	if !found {
		return nil, err
	}
	return s.view.listPods(f), nil
}

// ListStatuses returns the statuses of the containers f selects. They are
// shared with every other caller, and read-only.
func (s *Store) ListStatuses(f Filter) ([]*ContainerStatus, error) {
	found, err := resolve(&f.ID, s.containerID)
	if found {
		found, err = resolve(&f.PodID, s.podID)
	}
	if !found {
		return nil, err
	}
	return s.view.listStatuses(f), nil
}

// ContainersOf returns copies of the records of pod podID's containers
// (every pod's when empty).
func (s *Store) ContainersOf(podID string) []*Container { return s.view.containersOf(podID) }

// StatesOf returns the live states of pod podID's containers.
func (s *Store) StatesOf(podID string) []shim.State {
	_, states := s.view.listContainers(podID)
	return states
}

func (s *Store) podID(prefix string) (string, error) {
	p, err := s.view.pod(prefix)
	if err != nil {
		return "", err
	}
	return p.ID, nil
}

func (s *Store) containerID(prefix string) (string, error) {
	c, _, err := s.view.container(prefix)
	if err != nil {
		return "", err
	}
	return c.ID, nil
}
