package image

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

var leasesBucket = []byte("leases")

// Lease records that owner (a container) uses img's layers and returns their
// folders, bottom layer first. Garbage collection keeps leased layers even
// after the image itself is removed, until Release.
func (s *Service) Lease(owner string, img *Image) ([]string, error) {
	defer s.hold(img.ChainIDs...)()
	dirs := make([]string, 0, len(img.ChainIDs))
	for _, c := range img.ChainIDs {
		snap, ok, err := s.snaps.Get(c)
		if err != nil {
			return nil, err
		}
		if !ok {
			// Removed since the caller looked the image up: pull it again.
			return nil, fmt.Errorf("%w: image %s: layer %s was removed", ErrNotFound, img.ID, c)
		}
		dirs = append(dirs, s.snaps.Dir(snap))
	}
	v, err := json.Marshal(img.ChainIDs)
	if err != nil {
		return nil, err
	}
	err = s.opts.DB.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(leasesBucket).Put([]byte(owner), v)
	})
	return dirs, err
}

// Release drops owner's lease; what nothing uses any more is collected soon,
// in the background. Releasing an unknown owner is not an error.
func (s *Service) Release(owner string) error {
	if err := s.opts.DB.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(leasesBucket).Delete([]byte(owner))
	}); err != nil {
		return err
	}
	s.requestGC()
	return nil
}

// LeaseOwners lists the owners that hold a lease, for recovery to release
// those of containers that no longer exist.
func (s *Service) LeaseOwners() ([]string, error) {
	var owners []string
	err := s.opts.DB.View(func(tx *bolt.Tx) error {
		return tx.Bucket(leasesBucket).ForEach(func(k, _ []byte) error {
			owners = append(owners, string(k))
			return nil
		})
	})
	return owners, err
}

// LeaseOwnersOf lists the owners whose lease holds img's layers: the
// containers made from it.
func (s *Service) LeaseOwnersOf(img *Image) ([]string, error) {
	if len(img.ChainIDs) == 0 {
		return nil, nil
	}
	top := img.ChainIDs[len(img.ChainIDs)-1]
	var owners []string
	err := s.opts.DB.View(func(tx *bolt.Tx) error {
		return tx.Bucket(leasesBucket).ForEach(func(k, v []byte) error {
			var ids []string
			if err := json.Unmarshal(v, &ids); err != nil {
				return fmt.Errorf("lease %s: %w", k, err)
			}
			if len(ids) > 0 && ids[len(ids)-1] == top {
				owners = append(owners, string(k))
			}
			return nil
		})
	})
	return owners, err
}

// leasedChainIDs lists every chain ID some owner holds.
func leasedChainIDs(tx *bolt.Tx) (map[string]bool, error) {
	used := map[string]bool{}
	err := tx.Bucket(leasesBucket).ForEach(func(k, v []byte) error {
		var ids []string
		if err := json.Unmarshal(v, &ids); err != nil {
			return fmt.Errorf("lease %s: %w", k, err)
		}
		for _, id := range ids {
			used[id] = true
		}
		return nil
	})
	return used, err
}
