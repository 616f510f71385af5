package image

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/berth-runtime/berth/image/reference"
	bolt "go.etcd.io/bbolt"
)

var imagesBucket = []byte("images")

// names are the references a pull or import records for an image.
type names struct {
	tags    []string
	digests []string
}

// images is every image record in memory, indexed by ID and by name (repo
// tag and repo digest), written through to bolt and loaded from it at
// start: lookups never decode the database. It hands out copies.
type images struct {
	// writeMu serializes the transactions that change records: the
	// memory follows a commit (OnCommit), after bbolt let the next writer
	// in, which must not read what that commit changed before it shows.
	writeMu sync.Mutex

	mu     sync.RWMutex
	byID   map[string]*Image
	byName map[string]string // repo tag or repo digest → image ID
}

func loadImages(db *bolt.DB) (*images, error) {
	x := &images{byID: map[string]*Image{}, byName: map[string]string{}}
	err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(imagesBucket).ForEach(func(k, v []byte) error {
			var img Image
			if err := json.Unmarshal(v, &img); err != nil {
				return fmt.Errorf("image record %s: %w", k, err)
			}
			x.set(&img)
			return nil
		})
	})
	return x, err
}

// update runs a transaction that changes records; the memory shows its
// changes when it returns.
func (x *images) update(db *bolt.DB, f func(*bolt.Tx) error) error {
	x.writeMu.Lock()
	defer x.writeMu.Unlock()
	return db.Update(f)
}

func cloneImage(img *Image) *Image {
	c := *img
	c.RepoTags = slices.Clone(img.RepoTags)
	c.RepoDigests = slices.Clone(img.RepoDigests)
	c.ChainIDs = slices.Clone(img.ChainIDs)
	c.Manifests = slices.Clone(img.Manifests)
	c.Annotations = maps.Clone(img.Annotations)
	return &c
}

func (x *images) set(img *Image) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.unindex(img.ID)
	x.byID[img.ID] = img
	for _, n := range append(slices.Clone(img.RepoTags), img.RepoDigests...) {
		x.byName[n] = img.ID
	}
}

// unindex drops id's names; x.mu is held.
func (x *images) unindex(id string) {
	if old := x.byID[id]; old != nil {
		for _, n := range append(slices.Clone(old.RepoTags), old.RepoDigests...) {
			if x.byName[n] == id {
				delete(x.byName, n)
			}
		}
	}
}

// put writes img in tx; the memory has it once tx commits.
func (x *images) put(tx *bolt.Tx, img *Image) error {
	v, err := json.Marshal(img)
	if err != nil {
		return err
	}
	img = cloneImage(img)
	tx.OnCommit(func() { x.set(img) })
	return tx.Bucket(imagesBucket).Put([]byte(img.ID), v)
}

func (x *images) delete(tx *bolt.Tx, id string) error {
	tx.OnCommit(func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		x.unindex(id)
		delete(x.byID, id)
	})
	return tx.Bucket(imagesBucket).Delete([]byte(id))
}

// get returns the image whose ID is id, or nil.
func (x *images) get(id string) *Image {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if img := x.byID[id]; img != nil {
		return cloneImage(img)
	}
	return nil
}

// all returns the images keep selects (every one for nil).
func (x *images) all(keep func(*Image) bool) []*Image {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []*Image
	for _, img := range x.byID {
		if keep == nil || keep(img) {
			out = append(out, cloneImage(img))
		}
	}
	return out
}

// find resolves what a CRI caller may pass as an image: an ID (with or
// without "sha256:"), a tag or a digest reference in any form users write.
// It returns nil when nothing matches.
func (x *images) find(ref string) (*Image, error) {
	if reference.IsID(ref) {
		return x.get(reference.NormalizeID(ref)), nil
	}
	r, err := reference.Parse(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidReference, err)
	}
	x.mu.RLock()
	id := x.byName[r.String()]
	x.mu.RUnlock()
	return x.get(id), nil
}

// match returns the images a list filter names: every image of a
// repository given without tag (all its tags and digests), every image
// whose ID starts with a hex prefix, else what find finds.
func (x *images) match(filter string) ([]*Image, error) {
	repo, isRepo := reference.Repository(filter)
	isPrefix := reference.IsIDPrefix(filter)
	if !isRepo && !isPrefix {
		img, err := x.find(filter)
		if img == nil {
			return nil, err
		}
		return []*Image{img}, nil
	}
	prefix := reference.NormalizeID(filter)
	return x.all(func(img *Image) bool {
		return isPrefix && strings.HasPrefix(img.ID, prefix) ||
			isRepo && (slices.ContainsFunc(img.RepoTags, inRepository(repo, ":")) || slices.ContainsFunc(img.RepoDigests, inRepository(repo, "@")))
	}), nil
}

// inRepository matches the references of repo: repo, then sep ("name:tag",
// "name@digest").
func inRepository(repo, sep string) func(string) bool {
	return func(ref string) bool { return strings.HasPrefix(ref, repo+sep) }
}

// record stores img under its names. A tag names one image only: it moves
// from whatever image had it before (that image stays, untagged if it was
// its last tag, as with other runtimes). Run it within update.
func (x *images) record(tx *bolt.Tx, img *Image, n names) (*Image, error) {
	if stored := x.get(img.ID); stored != nil {
		img.Created = stored.Created
		img.RepoTags = stored.RepoTags
		img.RepoDigests = stored.RepoDigests
		img.Pinned = stored.Pinned
		img.Manifests = union(stored.Manifests, img.Manifests)
		img.Annotations = mergeMaps(stored.Annotations, img.Annotations)
	}
	if err := x.untag(tx, img.ID, n.tags); err != nil {
		return nil, err
	}
	img.RepoTags = union(img.RepoTags, n.tags)
	img.RepoDigests = union(img.RepoDigests, n.digests)
	return img, x.put(tx, img)
}

// untag removes tags from every image but id.
func (x *images) untag(tx *bolt.Tx, id string, tags []string) error {
	tagged := func(t string) bool { return slices.Contains(tags, t) }
	losers := x.all(func(img *Image) bool { return img.ID != id && slices.ContainsFunc(img.RepoTags, tagged) })
	for _, o := range losers {
		o.RepoTags = slices.DeleteFunc(o.RepoTags, tagged)
		if err := x.put(tx, o); err != nil {
			return err
		}
	}
	return nil
}

// references are the snapshots and blobs img needs.
func (img *Image) references() []string {
	refs := append([]string{img.ID}, img.ChainIDs...)
	return append(refs, img.Manifests...)
}

// mergeMaps is a with b's entries over it, a new map (nil when both are
// empty).
func mergeMaps(a, b map[string]string) map[string]string {
	if len(a)+len(b) == 0 {
		return nil
	}
	m := maps.Clone(a)
	if m == nil {
		m = map[string]string{}
	}
	maps.Copy(m, b)
	return m
}

// union appends the elements of b missing from a, keeping a's order.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
