package reference

import "testing"

func TestParse(t *testing.T) {
	const dgst = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cases := []struct {
		in, tag, digest, name string
	}{
		{"busybox", "docker.io/library/busybox:latest", "", "docker.io/library/busybox"},
		{"library/busybox:1.36", "docker.io/library/busybox:1.36", "", "docker.io/library/busybox"},
		{"docker.io/library/busybox:1.36", "docker.io/library/busybox:1.36", "", "docker.io/library/busybox"},
		{"docker.io/myorg/app", "docker.io/myorg/app:latest", "", "docker.io/myorg/app"},
		{"127.0.0.1:5000/repo:tag", "127.0.0.1:5000/repo:tag", "", "127.0.0.1:5000/repo"},
		{"127.0.0.1:5000/a/b/c", "127.0.0.1:5000/a/b/c:latest", "", "127.0.0.1:5000/a/b/c"},
		{"localhost/app:v1", "localhost/app:v1", "", "localhost/app"},
		{"busybox@" + dgst, "", dgst, "docker.io/library/busybox"},
		{"127.0.0.1:5000/repo@" + dgst, "", dgst, "127.0.0.1:5000/repo"},
		{"127.0.0.1:5000/repo:tag@" + dgst, "127.0.0.1:5000/repo:tag", dgst, "127.0.0.1:5000/repo"},
	}
	for _, c := range cases {
		r, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if r.TagString() != c.tag || r.Digest.String() != c.digest || r.Name() != c.name {
			t.Errorf("Parse(%q) = tag %q digest %q name %q; want %q %q %q", c.in, r.TagString(), r.Digest, r.Name(), c.tag, c.digest, c.name)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, in := range []string{"", "busybox/UPPER", "a:b:c", "busybox@sha256:short", "-bad", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) succeeded; want error", in)
		}
	}
}

func TestIsID(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if !IsID(id) || !IsID("sha256:"+id) || IsID("sha256:"+id[:10]) || IsID("busybox") {
		t.Error("IsID misclassifies")
	}
	if NormalizeID(id) != "sha256:"+id || NormalizeID("sha256:"+id) != "sha256:"+id {
		t.Error("NormalizeID")
	}
}
