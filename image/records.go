package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/berth-runtime/berth/image/reference"
	bolt "go.etcd.io/bbolt"
)

var imagesBucket = []byte("images")

// names are the references a pull or import records for an image.
type names struct {
	tags    []string
	digests []string
}

func getImage(tx *bolt.Tx, id string) (*Image, error) {
	v := tx.Bucket(imagesBucket).Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	var img Image
	if err := json.Unmarshal(v, &img); err != nil {
		return nil, fmt.Errorf("image record %s: %w", id, err)
	}
	return &img, nil
}

func putImage(tx *bolt.Tx, img *Image) error {
	v, err := json.Marshal(img)
	if err != nil {
		return err
	}
	return tx.Bucket(imagesBucket).Put([]byte(img.ID), v)
}

func listImages(tx *bolt.Tx) ([]*Image, error) {
	var out []*Image
	err := tx.Bucket(imagesBucket).ForEach(func(k, _ []byte) error {
		img, err := getImage(tx, string(k))
		if err == nil {
			out = append(out, img)
		}
		return err
	})
	return out, err
}

// imageKeys is the part of an image record that lookups and collection
// read: decoding only this skips building the config, which may be large.
type imageKeys struct {
	ID          string   `json:"id"`
	RepoTags    []string `json:"repoTags,omitempty"`
	RepoDigests []string `json:"repoDigests,omitempty"`
	ChainIDs    []string `json:"chainIDs"`
	Manifests   []string `json:"manifests,omitempty"`
}

// references are the snapshots and blobs an image needs.
func (k *imageKeys) references() []string {
	refs := append([]string{k.ID}, k.ChainIDs...)
	return append(refs, k.Manifests...)
}

// forEachImageKeys calls fn with the keys of every stored image.
func forEachImageKeys(tx *bolt.Tx, fn func(*imageKeys) error) error {
	return tx.Bucket(imagesBucket).ForEach(func(k, v []byte) error {
		var keys imageKeys
		if err := json.Unmarshal(v, &keys); err != nil {
			return fmt.Errorf("image record %s: %w", k, err)
		}
		return fn(&keys)
	})
}

// errFound ends a forEachImageKeys walk early.
var errFound = errors.New("found")

// findImage resolves what a CRI caller may pass as an image: an ID (with or
// without "sha256:"), a tag or a digest reference in any form users write.
// It returns nil when nothing matches.
func findImage(tx *bolt.Tx, ref string) (*Image, error) {
	if reference.IsID(ref) {
		return getImage(tx, reference.NormalizeID(ref))
	}
	r, err := reference.Parse(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidReference, err)
	}
	var id string
	err = forEachImageKeys(tx, func(k *imageKeys) error {
		if r.Digest != "" && slices.Contains(k.RepoDigests, r.DigestString(r.Digest)) ||
			r.Digest == "" && slices.Contains(k.RepoTags, r.TagString()) {
			id = k.ID
			return errFound
		}
		return nil
	})
	if id == "" || !errors.Is(err, errFound) {
		return nil, err
	}
	return getImage(tx, id)
}

// matchImages returns the images a list filter names: every image of a
// repository given without tag (all its tags and digests), every image
// whose ID starts with a hex prefix, else what findImage finds.
func matchImages(tx *bolt.Tx, filter string) ([]*Image, error) {
	repo, isRepo := reference.Repository(filter)
	isPrefix := reference.IsIDPrefix(filter)
	if !isRepo && !isPrefix {
		img, err := findImage(tx, filter)
		if img == nil {
			return nil, err
		}
		return []*Image{img}, nil
	}
	prefix := reference.NormalizeID(filter)
	var ids []string
	err := forEachImageKeys(tx, func(k *imageKeys) error {
		if isPrefix && strings.HasPrefix(k.ID, prefix) ||
			isRepo && (slices.ContainsFunc(k.RepoTags, inRepository(repo, ":")) || slices.ContainsFunc(k.RepoDigests, inRepository(repo, "@"))) {
			ids = append(ids, k.ID)
		}
		return nil
	})
	var out []*Image
	for _, id := range ids {
		if err != nil {
			break
		}
		var img *Image
		if img, err = getImage(tx, id); img != nil {
			out = append(out, img)
		}
	}
	return out, err
}

// inRepository matches the references of repo: repo, then sep ("name:tag",
// "name@digest").
func inRepository(repo, sep string) func(string) bool {
	return func(ref string) bool { return strings.HasPrefix(ref, repo+sep) }
}

// recordImage stores img under its names. A tag names one image only: it
// moves from whatever image had it before (that image stays, untagged if it
// was its last tag, as with other runtimes).
func recordImage(tx *bolt.Tx, img *Image, n names) (*Image, error) {
	stored, err := getImage(tx, img.ID)
	if err != nil {
		return nil, err
	}
	if stored != nil {
		img.Created = stored.Created
		img.RepoTags = stored.RepoTags
		img.RepoDigests = stored.RepoDigests
		img.Pinned = stored.Pinned
		img.Manifests = union(stored.Manifests, img.Manifests)
	}
	if err := untag(tx, img.ID, n.tags); err != nil {
		return nil, err
	}
	img.RepoTags = union(img.RepoTags, n.tags)
	img.RepoDigests = union(img.RepoDigests, n.digests)
	return img, putImage(tx, img)
}

// untag removes tags from every image but id.
func untag(tx *bolt.Tx, id string, tags []string) error {
	if len(tags) == 0 {
		return nil
	}
	var losers []string // changed after the walk: bbolt forbids writes during ForEach
	err := forEachImageKeys(tx, func(k *imageKeys) error {
		if k.ID != id && slices.ContainsFunc(k.RepoTags, func(t string) bool { return slices.Contains(tags, t) }) {
			losers = append(losers, k.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, l := range losers {
		o, err := getImage(tx, l)
		if err != nil {
			return err
		}
		o.RepoTags = slices.DeleteFunc(o.RepoTags, func(t string) bool { return slices.Contains(tags, t) })
		if err := putImage(tx, o); err != nil {
			return err
		}
	}
	return nil
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
