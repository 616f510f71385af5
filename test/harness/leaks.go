package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	bolt "go.etcd.io/bbolt"
)

// On-disk layout of berthd's root (owned by the image package).
const (
	IngestDir    = "content/ingest"       // in-progress downloads
	ResumableDir = "resumable"            // in IngestDir: downloads kept to resume, not leaks
	BlobsDir     = "content/blobs/sha256" // committed manifests, indexes, configs
	SnapshotsDir = "snapshots"            // one numeric folder per unpacked layer
	snapshotTmp  = "tmp-"                 // in-progress unpack folders under snapshots/
	snapshotFS   = "fs"                   // the layer's files inside a snapshot folder
)

type leakCheck struct {
	wantSnapshots int // -1: do not check the count
	wantWhy       string
}

// LeakOption adds a check to AssertNoLeaks.
type LeakOption func(*leakCheck)

// WantImages checks that the snapshot folders are exactly as many as the distinct
// layer chains of imgs: the images still stored need them, nothing else does.
// WantImages() with no image means no snapshot folder at all.
func WantImages(t testing.TB, imgs ...v1.Image) LeakOption {
	t.Helper()
	n := len(DistinctChainIDs(t, imgs...))
	return func(c *leakCheck) {
		c.wantSnapshots = n
		c.wantWhy = fmt.Sprintf("the distinct layer chains of %d stored image(s)", len(imgs))
	}
}

// WantSnapshots checks that there are exactly n snapshot folders.
func WantSnapshots(n int) LeakOption {
	return func(c *leakCheck) { c.wantSnapshots, c.wantWhy = n, "expected by the test" }
}

// Leaks lists what is half-written or unneeded in berthd's root: entries in
// content/ingest, snapshots/tmp-* folders, snapshot folders without fs/, blobs
// whose content does not match their name, and (with WantImages/WantSnapshots)
// a snapshot folder count other than expected.
func Leaks(root string, opts ...LeakOption) []string {
	c := leakCheck{wantSnapshots: -1}
	for _, o := range opts {
		o(&c)
	}
	var leaks []string
	ingest, err := readDirIfExists(filepath.Join(root, IngestDir))
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	for _, e := range ingest {
		if e.Name() == ResumableDir && e.IsDir() {
			continue // kept on purpose, bounded by age (the resume tests check them)
		}
		leaks = append(leaks, "in-progress download left behind: "+filepath.Join(root, IngestDir, e.Name()))
	}
	snaps, err := readDirIfExists(filepath.Join(root, SnapshotsDir))
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	committed := 0
	for _, e := range snaps {
		p := filepath.Join(root, SnapshotsDir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), snapshotTmp):
			leaks = append(leaks, "in-progress unpack left behind: "+p)
		case isNumeric(e.Name()) && e.IsDir():
			committed++
			if fi, err := os.Lstat(filepath.Join(p, snapshotFS)); err != nil || !fi.IsDir() {
				leaks = append(leaks, "snapshot folder without fs/: "+p)
			}
		default:
			leaks = append(leaks, "unexpected entry in snapshots/: "+p)
		}
	}
	if c.wantSnapshots >= 0 && committed != c.wantSnapshots {
		leaks = append(leaks, fmt.Sprintf("%d snapshot folders in %s, want %d (%s): %s",
			committed, filepath.Join(root, SnapshotsDir), c.wantSnapshots, c.wantWhy, names(snaps)))
	}
	blobs, err := readDirIfExists(filepath.Join(root, BlobsDir))
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	for _, e := range blobs {
		p := filepath.Join(root, BlobsDir, e.Name())
		if sum, err := fileSHA256(p); err != nil {
			leaks = append(leaks, fmt.Sprintf("blob %s: %v", p, err))
		} else if sum != e.Name() {
			leaks = append(leaks, fmt.Sprintf("blob %s holds content with digest sha256:%s", p, sum))
		}
	}
	return leaks
}

// collectWait bounds how long AssertNoLeaks gives berthd's background
// collector (it runs a fraction of a second after a removal) to finish.
const collectWait = 10 * time.Second

// AssertNoLeaks fails t for every leak Leaks finds in berthd's root once
// berthd's background collection had time to run.
func AssertNoLeaks(t testing.TB, root string, opts ...LeakOption) {
	t.Helper()
	deadline := time.Now().Add(collectWait)
	leaks := Leaks(root, opts...)
	for len(leaks) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		leaks = Leaks(root, opts...)
	}
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
}

func readDirIfExists(dir string) ([]fs.DirEntry, error) {
	es, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return es, err
}

func isNumeric(s string) bool {
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}

func names(es []fs.DirEntry) string {
	var ns []string
	for _, e := range es {
		ns = append(ns, e.Name())
	}
	return "[" + strings.Join(ns, " ") + "]"
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// SnapshotFSDirs lists the fs/ folders of all committed snapshots in root,
// in numeric order.
func SnapshotFSDirs(t testing.TB, root string) []string {
	t.Helper()
	es, err := readDirIfExists(filepath.Join(root, SnapshotsDir))
	if err != nil {
		t.Fatal(err)
	}
	type snap struct {
		n   uint64
		dir string
	}
	var snaps []snap
	for _, e := range es {
		if n, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && e.IsDir() {
			snaps = append(snaps, snap{n, filepath.Join(root, SnapshotsDir, e.Name(), snapshotFS)})
		}
	}
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].n < snaps[j].n })
	dirs := make([]string, len(snaps))
	for i, s := range snaps {
		dirs[i] = s.dir
	}
	return dirs
}

// FindInSnapshots returns the paths (ROOT/snapshots/N/fs/REL) of every committed
// snapshot that has an entry at rel ("etc/passwd"), of any type.
func FindInSnapshots(t testing.TB, root, rel string) []string {
	t.Helper()
	var found []string
	for _, dir := range SnapshotFSDirs(t, root) {
		p := filepath.Join(dir, rel)
		if _, err := os.Lstat(p); err == nil {
			found = append(found, p)
		}
	}
	return found
}

// UnsyncedLayers lists the chain IDs of the snapshots berthd's database (at
// root, berthd stopped) still marks as not yet synced to disk
// (image/snapshot's flusher clears the mark).
func UnsyncedLayers(t testing.TB, root string) []string {
	t.Helper()
	db, err := bolt.Open(filepath.Join(root, "meta.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("open berthd's database: %v", err)
	}
	defer db.Close()
	var unsynced []string
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("snapshots"))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var rec struct {
				UnsyncedBoot string `json:"unsyncedBoot"`
			}
			if err := json.Unmarshal(v, &rec); err != nil {
				return err
			}
			if rec.UnsyncedBoot != "" {
				unsynced = append(unsynced, string(k))
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("read berthd's snapshot records: %v", err)
	}
	return unsynced
}
