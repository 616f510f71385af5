// Package reference parses the image references users write ("busybox",
// "library/busybox:1.36", "host:5000/app@sha256:…") into their fully
// qualified form, the one berth stores as repo tags and repo digests.
package reference

import (
	"fmt"
	"strings"

	dref "github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// Ref is a fully qualified image reference.
type Ref struct {
	// Domain is the registry host ("docker.io", "127.0.0.1:5000").
	Domain string
	// Path is the repository inside the registry ("library/busybox").
	Path string
	// Tag is empty when the reference names a digest only.
	Tag string
	// Digest is set for "name@sha256:…" and "name:tag@sha256:…".
	Digest digest.Digest
}

// Parse normalizes s: a missing domain becomes docker.io, a single-component
// Docker Hub path gets library/, and a reference with neither tag nor digest
// gets the tag "latest". A bare image ID is not a reference: see IsID.
func Parse(s string) (Ref, error) {
	if s == "" {
		return Ref{}, fmt.Errorf("empty image reference")
	}
	if IsID(s) {
		return Ref{}, fmt.Errorf("%q is an image ID, not a reference", s)
	}
	named, err := dref.ParseNormalizedNamed(s)
	if err != nil {
		return Ref{}, fmt.Errorf("%q: %w", s, err)
	}
	named = dref.TagNameOnly(named)
	r := Ref{Domain: dref.Domain(named), Path: dref.Path(named)}
	if t, ok := named.(dref.Tagged); ok {
		r.Tag = t.Tag()
	}
	if d, ok := named.(dref.Digested); ok {
		r.Digest = d.Digest()
	}
	return r, nil
}

// Repository returns the fully qualified repository s names when s is a
// repository without tag or digest ("busybox" is
// "docker.io/library/busybox"); ok is false for any other s.
func Repository(s string) (name string, ok bool) {
	if IsID(s) {
		return "", false
	}
	named, err := dref.ParseNormalizedNamed(s)
	if err != nil || !dref.IsNameOnly(named) {
		return "", false
	}
	return named.Name(), true
}

// IsIDPrefix reports whether s may begin an image ID: hex digits, with or
// without "sha256:".
func IsIDPrefix(s string) bool {
	hex := strings.TrimPrefix(s, "sha256:")
	return hex != "" && len(hex) <= 64 && strings.Trim(hex, "0123456789abcdef") == ""
}

// Name is the repository without tag or digest ("docker.io/library/busybox").
func (r Ref) Name() string { return r.Domain + "/" + r.Path }

// TagString is "name:tag", or "" when the reference has no tag.
func (r Ref) TagString() string {
	if r.Tag == "" {
		return ""
	}
	return r.Name() + ":" + r.Tag
}

// DigestString is "name@digest" for the given digest.
func (r Ref) DigestString(d digest.Digest) string { return r.Name() + "@" + d.String() }

// String is the most specific form: the digest when pinned, else the tag.
func (r Ref) String() string {
	if r.Digest != "" {
		return r.DigestString(r.Digest)
	}
	return r.TagString()
}

// IsID reports whether s is an image ID: "sha256:<64 hex>" or the bare 64 hex.
func IsID(s string) bool {
	hex := strings.TrimPrefix(s, "sha256:")
	if len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// NormalizeID returns an image ID with its "sha256:" prefix.
func NormalizeID(s string) string { return "sha256:" + strings.TrimPrefix(s, "sha256:") }
