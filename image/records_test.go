package image

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestMatchImages: a list filter names a repository without tag (every
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
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(imagesBucket); err != nil {
			return err
		}
		for img, n := range map[*Image]names{
			busybox1: {tags: []string{"docker.io/library/busybox:1.36"}},
			busybox2: {tags: []string{"docker.io/library/busybox:latest"}, digests: []string{"docker.io/library/busybox@sha256:" + strings.Repeat("d", 64)}},
			alpine:   {tags: []string{"docker.io/library/alpine:3", "docker.io/library/busyboxy:1"}},
		} {
			if _, err := recordImage(tx, img, n); err != nil {
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
		var got []*Image
		if err := db.View(func(tx *bolt.Tx) (err error) {
			got, err = matchImages(tx, filter)
			return err
		}); err != nil {
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
