package image

import (
	"encoding/json"
	"fmt"
	"slices"

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
	all, err := listImages(tx)
	if err != nil {
		return nil, err
	}
	for _, img := range all {
		if r.Digest != "" && slices.Contains(img.RepoDigests, r.DigestString(r.Digest)) ||
			r.Digest == "" && slices.Contains(img.RepoTags, r.TagString()) {
			return img, nil
		}
	}
	return nil, nil
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
	if len(n.tags) > 0 {
		others, err := listImages(tx)
		if err != nil {
			return nil, err
		}
		for _, o := range others {
			if o.ID == img.ID {
				continue
			}
			kept := slices.DeleteFunc(slices.Clone(o.RepoTags), func(t string) bool { return slices.Contains(n.tags, t) })
			if len(kept) != len(o.RepoTags) {
				o.RepoTags = kept
				if err := putImage(tx, o); err != nil {
					return nil, err
				}
			}
		}
	}
	img.RepoTags = union(img.RepoTags, n.tags)
	img.RepoDigests = union(img.RepoDigests, n.digests)
	return img, putImage(tx, img)
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
