package image

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestMatchImages: the images in memory, as records put them; a list filter names a repository without tag (every
// tag, short or long), an ID prefix with or without sha256:, or one image.
func TestMatchImages(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	busybox1 := &Image{ID: "sha256:" + strings.Repeat("a", 64)}
	busybox2 := &Image{ID: "sha256:" + strings.Repeat("ab", 32)}
	alpine := &Image{ID: "sha256:" + strings.Repeat("c", 64)}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(imagesBucket)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	x, err := loadImages(db)
	if err != nil {
		t.Fatal(err)
	}
	err = x.update(db, func(tx *bolt.Tx) error {
		for img, n := range map[*Image]names{
			busybox1: {tags: []string{"docker.io/library/busybox:1.36"}},
			busybox2: {tags: []string{"docker.io/library/busybox:latest"}, digests: []string{"docker.io/library/busybox@sha256:" + strings.Repeat("d", 64)}},
			alpine:   {tags: []string{"docker.io/library/alpine:3", "docker.io/library/busyboxy:1"}},
		} {
			if _, err := x.record(tx, img, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for filter, want := range map[string][]string{
		"busybox":                   {busybox1.ID, busybox2.ID},
		"docker.io/library/busybox": {busybox1.ID, busybox2.ID},
		"library/busybox":           {busybox1.ID, busybox2.ID},
		"busybox:1.36":              {busybox1.ID},
		"busybox:2":                 nil,
		"aaaa":                      {busybox1.ID},
		"sha256:a":                  {busybox1.ID, busybox2.ID},
		alpine.ID:                   {alpine.ID},
		"nothing":                   nil,
		"busybox@sha256:" + strings.Repeat("d", 64): {busybox2.ID},
	} {
		got, err := x.match(filter)
		if err != nil {
			t.Fatalf("%q: %v", filter, err)
		}
		var ids []string
		for _, img := range got {
			ids = append(ids, img.ID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, want) {
			t.Errorf("%q: got %v, want %v", filter, ids, want)
		}
	}
}

// TestImagesWriteThrough: a tag moves between images in memory and in
// bolt alike, and a reload from bolt finds what memory had.
func TestImagesWriteThrough(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(imagesBucket)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	x, err := loadImages(db)
	if err != nil {
		t.Fatal(err)
	}
	a, b := &Image{ID: "sha256:" + strings.Repeat("a", 64)}, &Image{ID: "sha256:" + strings.Repeat("b", 64)}
	const tag = "docker.io/library/app:1"
	for _, img := range []*Image{a, b} { // the tag moves from a to b
		if err := x.update(db, func(tx *bolt.Tx) error {
			_, err := x.record(tx, &Image{ID: img.ID}, names{tags: []string{tag}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	reloaded, err := loadImages(db)
	if err != nil {
		t.Fatal(err)
	}
	for name, idx := range map[string]*images{"memory": x, "reloaded": reloaded} {
		got, err := idx.find("app:1")
		if err != nil || got == nil || got.ID != b.ID {
			t.Errorf("%s: app:1 is %v, %v; want %s", name, got, err, b.ID)
		}
		if old := idx.get(a.ID); old == nil || len(old.RepoTags) != 0 {
			t.Errorf("%s: the image that lost the tag is %+v, want it kept untagged", name, old)
		}
	}
	if err := x.update(db, func(tx *bolt.Tx) error { return x.delete(tx, b.ID) }); err != nil {
		t.Fatal(err)
	}
	if got, _ := x.find("app:1"); got != nil || x.get(b.ID) != nil {
		t.Errorf("after delete: find %v, get %v; want neither", got, x.get(b.ID))
	}
}
