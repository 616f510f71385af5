package image

import "testing"

func TestNames(t *testing.T) {
	id := "sha256:" + "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12"
	img := &Image{ID: id,
		RepoTags:    []string{"docker.io/library/busybox:1.36", "127.0.0.1:5000/app:v1"},
		RepoDigests: []string{"docker.io/library/busybox@sha256:1111", "127.0.0.1:5000/app@sha256:2222"}}
	for _, c := range []struct{ asked, name, digest string }{
		{"127.0.0.1:5000/app:v1", "127.0.0.1:5000/app:v1", "127.0.0.1:5000/app@sha256:2222"},
		{"busybox:1.36", "busybox:1.36", "docker.io/library/busybox@sha256:1111"},
		{id, "docker.io/library/busybox:1.36", "docker.io/library/busybox@sha256:1111"},
		{"other.example/x:1", "other.example/x:1", "docker.io/library/busybox@sha256:1111"},
	} {
		if name, d := img.Names(c.asked); name != c.name || d != c.digest {
			t.Errorf("Names(%q) = %q, %q; want %q, %q", c.asked, name, d, c.name, c.digest)
		}
	}
	imported := &Image{ID: id}
	if name, d := imported.Names(id); name != id || d != "" {
		t.Errorf("imported image: Names = %q, %q; want the ID and no digest", name, d)
	}
}
