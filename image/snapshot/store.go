// Package snapshot keeps one read-only folder per unpacked image layer, keyed
// by the layer's chain ID. Folders get short numeric names so that an overlay
// mount of many layers fits in one page of mount options.
package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-runtime/berth/cri/crashpoint"
	bolt "go.etcd.io/bbolt"
)

var bucket = []byte("snapshots")

// ErrExists is returned (wrapped) by Commit when the chain ID has a
// snapshot already: another unpack of the same layer committed first.
var ErrExists = errors.New("snapshot exists")

const tmpPrefix = "tmp-"

// Snapshot is one committed layer.
type Snapshot struct {
	ChainID string `json:"chainID"`
	Name    string `json:"name"` // folder name under the store root
	Size    int64  `json:"size"`
	Inodes  int64  `json:"inodes"`
}

// record is a snapshot as the database keeps it.
type record struct {
	Snapshot
	// UnsyncedBoot is the boot (bootID) the snapshot was committed in,
	// until a syncfs after its commit finished (see flusher).
	UnsyncedBoot string `json:"unsyncedBoot,omitempty"`
}

// Store manages the snapshot folders under root; their records live in db.
type Store struct {
	root  string
	db    *bolt.DB
	boot  string
	flush *flusher
}

// Open prepares root and reconciles it with the records in db: unfinished
// unpacks, folders without a record, records without a folder (a crash
// between the two steps of Commit or Remove) and snapshots a reboot caught
// before they were synced are dropped; those of this boot are synced (a
// failed sync leaves them to the flushes, as a commit's).
// Close stops the background flushes Open starts.
func Open(root string, db *bolt.DB, log *slog.Logger) (*Store, error) {
	boot, err := bootID()
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	s := &Store{root: root, db: db, boot: boot}
	s.flush = newFlusher(func() error { return syncFS(root) }, s.markSynced, log)
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucket)
		return err
	}); err != nil {
		return nil, err
	}
	if err := s.reconcile(log); err != nil {
		return nil, err
	}
	s.flush.flush() // what reconcile found of this boot, before anything uses it
	go s.flush.run()
	return s, nil
}

// Close makes what was committed durable and stops the flushes.
func (s *Store) Close() { s.flush.close() }

func (s *Store) reconcile(log *slog.Logger) error {
	known := map[string]bool{}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		return b.ForEach(func(k, v []byte) error {
			var rec record
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("snapshot record %s: %w", k, err)
			}
			if rec.UnsyncedBoot != "" && rec.UnsyncedBoot != s.boot {
				log.Warn("dropping a layer the machine went down with before it was on disk; its images are pulled again", "layer", rec.ChainID)
				return b.Delete(k) // safe: ForEach tolerates deleting the current key
			}
			if _, err := os.Stat(s.Dir(rec.Snapshot)); err != nil {
				return b.Delete(k)
			}
			known[rec.Name] = true
			if rec.UnsyncedBoot != "" {
				s.flush.add(rec.Name, rec.ChainID)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !known[e.Name()] {
			if err := os.RemoveAll(filepath.Join(s.root, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// markSynced clears the marks of the snapshots (name → chain ID) a syncfs
// covered. A chain ID removed, or removed and committed again under another
// name, since is left alone.
func (s *Store) markSynced(synced map[string]string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		for name, chainID := range synced {
			rec, ok, err := getRecord(b, chainID)
			if err != nil {
				return err
			}
			if !ok || rec.Name != name || rec.UnsyncedBoot == "" {
				continue
			}
			rec.UnsyncedBoot = ""
			if err := putRecord(b, rec); err != nil {
				return err
			}
		}
		return nil
	})
}

func getRecord(b *bolt.Bucket, chainID string) (record, bool, error) {
	var rec record
	v := b.Get([]byte(chainID))
	if v == nil {
		return rec, false, nil
	}
	return rec, true, json.Unmarshal(v, &rec)
}

func putRecord(b *bolt.Bucket, rec record) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return b.Put([]byte(rec.ChainID), v)
}

// Dir is the folder holding the layer's files (an overlay lowerdir).
func (s *Store) Dir(snap Snapshot) string { return filepath.Join(s.root, snap.Name, "fs") }

// Get returns the committed snapshot for chainID.
func (s *Store) Get(chainID string) (Snapshot, bool, error) {
	var snap Snapshot
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucket).Get([]byte(chainID))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &snap)
	})
	return snap, found, err
}

// List returns every committed snapshot.
func (s *Store) List() ([]Snapshot, error) {
	var out []Snapshot
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(_, v []byte) error {
			var snap Snapshot
			if err := json.Unmarshal(v, &snap); err != nil {
				return err
			}
			out = append(out, snap)
			return nil
		})
	})
	return out, err
}

// Prepare creates an empty folder to unpack a layer into. The caller passes
// the returned path to Commit or Abort.
func (s *Store) Prepare() (string, error) {
	tmp, err := os.MkdirTemp(s.root, tmpPrefix)
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(filepath.Join(tmp, "fs"), 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	return filepath.Join(tmp, "fs"), nil
}

// Abort discards a prepared folder.
func (s *Store) Abort(fsDir string) error { return os.RemoveAll(filepath.Dir(fsDir)) }

// Commit makes a prepared folder the snapshot for chainID: the folder is
// renamed to its short name and recorded, marked unsynced until the next
// flush has made its files durable (see flusher).
func (s *Store) Commit(chainID, fsDir string, size, inodes int64) (Snapshot, error) {
	tmp := filepath.Dir(fsDir)
	if !strings.HasPrefix(filepath.Base(tmp), tmpPrefix) || filepath.Dir(tmp) != s.root {
		return Snapshot{}, fmt.Errorf("snapshot: %s was not prepared by this store", fsDir)
	}
	rec := record{Snapshot: Snapshot{ChainID: chainID, Size: size, Inodes: inodes}, UnsyncedBoot: s.boot}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		if b.Get([]byte(chainID)) != nil {
			return ErrExists
		}
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		rec.Name = strconv.FormatUint(seq, 10)
		// Rename inside the transaction: if it fails, nothing is recorded;
		// if the commit then fails, Open's reconcile removes the folder.
		if err := os.Rename(tmp, filepath.Join(s.root, rec.Name)); err != nil {
			return err
		}
		return putRecord(b, rec)
	})
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s: commit: %w", chainID, err)
	}
	s.flush.add(rec.Name, chainID)
	return rec.Snapshot, nil
}

// Remove deletes the record, then the folder. A missing snapshot is not an
// error.
func (s *Store) Remove(chainID string) error {
	var snap Snapshot
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		v := b.Get([]byte(chainID))
		if v == nil {
			return nil
		}
		if err := json.Unmarshal(v, &snap); err != nil {
			return err
		}
		return b.Delete([]byte(chainID))
	})
	if err != nil || snap.Name == "" {
		return err
	}
	crashpoint.Hit("collect image garbage", "snapshot record deleted")
	return os.RemoveAll(filepath.Join(s.root, snap.Name))
}
