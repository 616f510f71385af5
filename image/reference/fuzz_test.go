package reference

import "testing"

// FuzzParse checks that whatever Parse accepts is fully qualified and
// parses back to itself.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"busybox", "library/busybox:1.36", "127.0.0.1:5000/a/b:t",
		"localhost/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"UPPER/case", "a:b:c", "sha256:0123", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"[::1]:5000/x", "host/../x", "a@sha256:zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(s)
		if err != nil {
			return
		}
		if r.Domain == "" || r.Path == "" || (r.Tag == "" && r.Digest == "") {
			t.Fatalf("Parse(%q) = %+v: not fully qualified", s, r)
		}
		if r.Digest != "" {
			if err := r.Digest.Validate(); err != nil {
				t.Fatalf("Parse(%q) kept an invalid digest %q: %v", s, r.Digest, err)
			}
		}
		want := r
		if r.Digest != "" {
			want.Tag = "" // String is the digest form only
		}
		again, err := Parse(r.String())
		if err != nil || again != want {
			t.Fatalf("Parse(%q) = %+v, but Parse(%q) = %+v, %v", s, r, r.String(), again, err)
		}
	})
}
