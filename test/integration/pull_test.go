package integration

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// hubMirror sends docker.io pulls to reg.
func hubMirror(reg *harness.Registry) string {
	return harness.RegistryTOML(map[string]harness.HostConfig{"docker.io": {Mirrors: []string{reg.URL()}}})
}

// snapshotFile returns the content of rel in the one snapshot that has it.
func snapshotFile(t *testing.T, root, rel string) []byte {
	t.Helper()
	hits := harness.FindInSnapshots(t, root, rel)
	if len(hits) != 1 {
		t.Fatalf("%s is in %d snapshots (%v), want 1", rel, len(hits), hits)
	}
	b, err := os.ReadFile(hits[0])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPullReferenceForms(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	for _, repoTag := range []string{"library/busybox:latest", "library/busybox:1.36", "berth/busybox:1.36"} {
		reg.Push(t, repoTag, img)
	}
	id, dg := harness.ConfigDigest(t, img), harness.ManifestDigest(t, img)
	hub, local := "docker.io/library/busybox", reg.Host()+"/berth/busybox"
	config := harness.PlainHTTP(reg.Host()) + hubMirror(reg)

	cases := []struct {
		name, ref     string
		tags, digests []string
		tagOptional   bool // repo:tag@digest: the digest wins, the tag may be dropped
	}{
		{"short-name", "busybox", []string{hub + ":latest"}, []string{hub + "@" + dg}, false},
		{"library-repo-tag", "library/busybox:1.36", []string{hub + ":1.36"}, []string{hub + "@" + dg}, false},
		{"docker.io-full", "docker.io/library/busybox:1.36", []string{hub + ":1.36"}, []string{hub + "@" + dg}, false},
		{"short-name-digest", "busybox@" + dg, nil, []string{hub + "@" + dg}, false},
		{"docker.io-digest", hub + "@" + dg, nil, []string{hub + "@" + dg}, false},
		{"host-port-repo-tag", local + ":1.36", []string{local + ":1.36"}, []string{local + "@" + dg}, false},
		{"host-port-repo-digest", local + "@" + dg, nil, []string{local + "@" + dg}, false},
		{"host-port-repo-tag-digest", local + ":1.36@" + dg, nil, []string{local + "@" + dg}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := harness.StartDaemon(t, harness.Options{ConfigTOML: config})
			mustPull(t, d, c.ref, id)
			st := mustStatus(t, d, c.ref)
			if st.Id != id {
				t.Errorf("ImageStatus(%s).Id = %s, want %s", c.ref, st.Id, id)
			}
			tags := c.tags
			if c.tagOptional && len(st.RepoTags) > 0 {
				tags = []string{local + ":1.36"}
			}
			assertNames(t, st, tags, c.digests)
			if strings.Contains(c.digests[0], hub) {
				assertNoMention(t, st, reg.Host())
			}
			if imgs := listImages(t, d, ""); len(imgs) != 1 {
				t.Errorf("ListImages has %d images, want 1", len(imgs))
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

func TestPullThroughMirrors(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	id, dg := harness.ConfigDigest(t, img), harness.ManifestDigest(t, img)
	live, missing := harness.NewRegistry(t), harness.NewRegistry(t)
	live.Push(t, "berth/busybox:1.36", img)
	live.Push(t, "library/busybox:1.36", img)
	dead := "http://" + harness.FreePort(t)
	unreachable := harness.FreePort(t) // a registry host nobody answers on

	cases := []struct {
		name    string
		host    string // the [registry."HOST"] table
		mirrors []string
		ref     string
		repo    string // the name berth must record (repo without tag)
		ok      bool
	}{
		{"mirror-in-front-of-unreachable-host", unreachable, []string{live.URL()},
			unreachable + "/berth/busybox:1.36", unreachable + "/berth/busybox", true},
		{"dead-mirror-then-live-mirror", unreachable, []string{dead, live.URL()},
			unreachable + "/berth/busybox:1.36", unreachable + "/berth/busybox", true},
		{"mirror-without-image-then-live-mirror", unreachable, []string{missing.URL(), live.URL()},
			unreachable + "/berth/busybox:1.36", unreachable + "/berth/busybox", true},
		{"dead-mirror-then-host-itself", live.Host(), []string{dead},
			live.Host() + "/berth/busybox:1.36", live.Host() + "/berth/busybox", true},
		{"docker.io-dead-mirror-then-live-mirror", "docker.io", []string{dead, live.URL()},
			"busybox:1.36", "docker.io/library/busybox", true},
		{"everything-unreachable", unreachable, []string{dead},
			unreachable + "/berth/busybox:1.36", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			hosts := map[string]harness.HostConfig{
				live.Host():    {PlainHTTP: true},
				missing.Host(): {PlainHTTP: true},
			}
			hosts[c.host] = harness.HostConfig{Mirrors: c.mirrors, PlainHTTP: c.host != "docker.io"}
			d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.RegistryTOML(hosts)})
			got, err := pull(t, d, c.ref, nil)
			if !c.ok {
				if err == nil {
					t.Fatalf("pull of %s with every endpoint unreachable succeeded (%s)", c.ref, got)
				}
				assertAbsent(t, d, c.ref)
				harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
				return
			}
			if err != nil || got != id {
				t.Fatalf("PullImage(%s) = %q, %v; want %s", c.ref, got, err, id)
			}
			st := mustStatus(t, d, c.ref)
			assertNames(t, st, []string{c.repo + ":1.36"}, []string{c.repo + "@" + dg})
			for _, m := range c.mirrors {
				if c.host != strings.TrimPrefix(m, "http://") {
					assertNoMention(t, st, strings.TrimPrefix(m, "http://"))
				}
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

func TestPullManifestFormatsAndCompressions(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	cases := []struct {
		name   string
		format harness.Format
		comp   harness.Compression
		index  bool
	}{
		{"oci-gzip", harness.OCI, harness.Gzip, false},
		{"oci-zstd", harness.OCI, harness.Zstd, false},
		{"oci-uncompressed", harness.OCI, harness.Uncompressed, false},
		{"docker-schema2-gzip", harness.Docker, harness.Gzip, false},
		{"docker-schema2-uncompressed", harness.Docker, harness.Uncompressed, false},
		{"oci-index", harness.OCI, harness.Gzip, true},
		{"docker-manifest-list", harness.Docker, harness.Gzip, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			img := harness.BusyboxImage(t, harness.ImageSpec{Format: c.format, Compression: c.comp,
				Layers: [][]harness.File{{harness.Dir("etc", 0o755), harness.Reg("etc/format", c.name, 0o644)}}})
			var p harness.Pushed
			var others []v1.Hash // manifests of the platforms berth must not pull
			if c.index {
				idx := harness.Index(t, c.format, img)
				p = reg.PushIndex(t, "formats/"+c.name+":1", idx)
				for _, pf := range []harness.Platform{harness.ARM64, harness.ARMv7} {
					d, _ := harness.PlatformImage(t, idx, pf).Digest()
					others = append(others, d)
				}
			} else {
				p = reg.Push(t, "formats/"+c.name+":1", img)
			}
			d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host())})
			mustPull(t, d, p.Name, harness.ConfigDigest(t, img))
			st := mustStatus(t, d, p.Name)
			// For an index, the repo digest is the index's: what the registry served for the tag.
			assertNames(t, st, []string{p.Name}, []string{p.DigestRef()})

			if got := snapshotFile(t, d.Root, "etc/format"); string(got) != c.name {
				t.Errorf("etc/format = %q, want %q", got, c.name)
			}
			if got := snapshotFile(t, d.Root, "bin/busybox"); !bytes.Equal(got, harness.BusyboxBinary(t)) {
				t.Errorf("unpacked bin/busybox differs from %s (%d bytes, want %d)", harness.BusyboxPath, len(got), len(harness.BusyboxBinary(t)))
			}
			if hits := harness.FindInSnapshots(t, d.Root, "etc/arch"); len(hits) != 0 {
				t.Errorf("a foreign platform's layer was unpacked: %v", hits)
			}
			for _, o := range others {
				if n := reg.Fetches(o); n != 0 {
					t.Errorf("the manifest of another platform (%s) was fetched %d times", o, n)
				}
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

// unpackCheck passes when some snapshot's entry at path satisfies it.
type unpackCheck struct {
	path, what string
	ok         func(p string, st *syscall.Stat_t) error
}

func getxattr(p, attr string) (string, error) {
	buf := make([]byte, 256)
	n, err := syscall.Getxattr(p, attr, buf)
	if err != nil {
		return "", fmt.Errorf("getxattr %s: %w", attr, err)
	}
	return string(buf[:n]), nil
}

func isType(st *syscall.Stat_t, typ uint32, name string) error {
	if st.Mode&syscall.S_IFMT != typ {
		return fmt.Errorf("mode %o is not a %s", st.Mode, name)
	}
	return nil
}

func permIs(st *syscall.Stat_t, want uint32) error {
	if got := st.Mode & 0o7777; got != want {
		return fmt.Errorf("permissions %04o, want %04o", got, want)
	}
	return nil
}

func ownerIs(st *syscall.Stat_t, uid, gid uint32) error {
	if st.Uid != uid || st.Gid != gid {
		return fmt.Errorf("owner %d:%d, want %d:%d", st.Uid, st.Gid, uid, gid)
	}
	return nil
}

func whiteoutDevice(_ string, st *syscall.Stat_t) error {
	if err := isType(st, syscall.S_IFCHR, "character device"); err != nil {
		return err
	}
	if st.Rdev != 0 {
		return fmt.Errorf("device %d, want 0/0", st.Rdev)
	}
	return nil
}

func linkTo(target string) func(string, *syscall.Stat_t) error {
	return func(p string, st *syscall.Stat_t) error {
		if err := isType(st, syscall.S_IFLNK, "symlink"); err != nil {
			return err
		}
		if got, _ := os.Readlink(p); got != target {
			return fmt.Errorf("points to %q, want %q", got, target)
		}
		return nil
	}
}

func all(checks ...func(string, *syscall.Stat_t) error) func(string, *syscall.Stat_t) error {
	return func(p string, st *syscall.Stat_t) error {
		for _, c := range checks {
			if err := c(p, st); err != nil {
				return err
			}
		}
		return nil
	}
}

func regular(content string, perm uint32) func(string, *syscall.Stat_t) error {
	return func(p string, st *syscall.Stat_t) error {
		if err := isType(st, syscall.S_IFREG, "regular file"); err != nil {
			return err
		}
		if err := permIs(st, perm); err != nil {
			return err
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != content {
			return fmt.Errorf("content %q (%v), want %q", b, err, content)
		}
		return nil
	}
}

func directory(perm uint32) func(string, *syscall.Stat_t) error {
	return func(_ string, st *syscall.Stat_t) error {
		if err := isType(st, syscall.S_IFDIR, "directory"); err != nil {
			return err
		}
		return permIs(st, perm)
	}
}

func owned(uid, gid uint32) func(string, *syscall.Stat_t) error {
	return func(_ string, st *syscall.Stat_t) error { return ownerIs(st, uid, gid) }
}

// TestPullWhiteoutsAndAttributes pulls a three-layer image (busybox; files with
// owners, modes, setuid, xattrs, times and links; whiteouts) and inspects the
// snapshot folders berthd unpacked.
func TestPullWhiteoutsAndAttributes(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	attrs := []harness.File{
		harness.Dir("srv", 0o755),
		{Path: "srv/owned", Content: []byte("owned"), Mode: 0o640, UID: 1002, GID: 1004},
		{Path: "srv/suid", Content: []byte("#!/bin/sh\n"), Mode: 0o4755},
		{Path: "srv/sgid-dir", Type: '5', Mode: 0o2775, UID: 33, GID: 33},
		{Path: "srv/sticky", Type: '5', Mode: 0o1777},
		{Path: "srv/xattr", Content: []byte("x"), Xattrs: map[string]string{"user.berth": "kept"}},
		{Path: "srv/old", Content: []byte("old"), ModTime: old},
		harness.Symlink("srv/link", "owned"),
		harness.Hardlink("srv/hard", "srv/owned"),
		harness.Dir("opt", 0o755),
		harness.Dir("opt/dir", 0o755),
		harness.Reg("opt/dir/a", "a", 0o644),
		harness.Reg("opt/dir/b", "b", 0o644),
		harness.Reg("etc/gone", "bye", 0o644),
	}
	whiteouts := []harness.File{
		harness.Dir("etc", 0o755),
		harness.Whiteout("etc/gone"),
		harness.Whiteout("bin/ls"),
		harness.Dir("opt", 0o755),
		harness.Dir("opt/dir", 0o755),
		harness.OpaqueWhiteout("opt/dir"),
		harness.Reg("opt/dir/c", "c", 0o644),
	}
	img := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{attrs, whiteouts}})
	p := reg.Push(t, "berth/layers:1", img)
	mustPull(t, d, p.Name, p.ID)

	checks := []unpackCheck{
		{"bin/busybox", "0755 root file", all(owned(0, 0), func(_ string, st *syscall.Stat_t) error { return permIs(st, 0o755) })},
		{"bin/sh", "symlink to busybox", linkTo("busybox")},
		{"tmp", "1777 directory", directory(0o1777)},
		{"root", "0700 directory", directory(0o700)},
		{"etc/gone", "the regular file of layer 2", regular("bye", 0o644)},
		{"etc/gone", "an overlay whiteout (0/0 char device) in layer 3", whiteoutDevice},
		{"bin/ls", "an overlay whiteout of a lower symlink", whiteoutDevice},
		{"opt/dir", "an opaque directory (trusted.overlay.opaque=y) holding only c", func(p string, st *syscall.Stat_t) error {
			if v, err := getxattr(p, "trusted.overlay.opaque"); err != nil || v != "y" {
				return fmt.Errorf("trusted.overlay.opaque = %q (%v)", v, err)
			}
			if _, err := os.Lstat(p + "/c"); err != nil {
				return err
			}
			if _, err := os.Lstat(p + "/a"); err == nil {
				return fmt.Errorf("opaque layer also has a")
			}
			return nil
		}},
		{"opt/dir/a", "the file of layer 2", regular("a", 0o644)},
		{"srv/owned", "1002:1004 0640", all(owned(1002, 1004), regular("owned", 0o640))},
		{"srv/suid", "setuid 04755", regular("#!/bin/sh\n", 0o4755)},
		{"srv/sgid-dir", "setgid 02775 directory of 33:33", all(directory(0o2775), owned(33, 33))},
		{"srv/sticky", "1777 directory", directory(0o1777)},
		{"srv/xattr", "user.berth=kept", func(p string, _ *syscall.Stat_t) error {
			if v, err := getxattr(p, "user.berth"); err != nil || v != "kept" {
				return fmt.Errorf("user.berth = %q (%v)", v, err)
			}
			return nil
		}},
		{"srv/old", "mtime " + old.String(), func(_ string, st *syscall.Stat_t) error {
			if got := time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(); !got.Equal(old) {
				return fmt.Errorf("mtime %s", got)
			}
			return nil
		}},
		{"srv/link", "symlink to owned", linkTo("owned")},
		{"srv/hard", "hard link of srv/owned", func(p string, st *syscall.Stat_t) error {
			var o syscall.Stat_t
			if err := syscall.Lstat(strings.TrimSuffix(p, "hard")+"owned", &o); err != nil {
				return err
			}
			if o.Ino != st.Ino || st.Nlink != 2 {
				return fmt.Errorf("inode %d (nlink %d), srv/owned is %d", st.Ino, st.Nlink, o.Ino)
			}
			return nil
		}},
	}
	for _, c := range checks {
		hits := harness.FindInSnapshots(t, d.Root, c.path)
		var errs []string
		passed := false
		for _, h := range hits {
			var st syscall.Stat_t
			if err := syscall.Lstat(h, &st); err != nil {
				errs = append(errs, err.Error())
				continue
			}
			if err := c.ok(h, &st); err != nil {
				errs = append(errs, h+": "+err.Error())
				continue
			}
			passed = true
		}
		if !passed {
			t.Errorf("no snapshot has %s as %s; found: %v", c.path, c.what, errs)
		}
	}
	// No OCI whiteout name survives unpacking.
	for _, dir := range harness.SnapshotFSDirs(t, d.Root) {
		err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(e.Name(), ".wh.") {
				t.Errorf("OCI whiteout entry left as a file: %s", p)
			}
			return err
		})
		if err != nil {
			t.Error(err)
		}
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

func TestPullAuth(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	id := harness.ConfigDigest(t, img)
	const user, pass = "alice", "s3cret"
	b64 := func(u, p string) string { return base64.StdEncoding.EncodeToString([]byte(u + ":" + p)) }
	for _, mode := range []struct {
		name string
		opt  harness.RegistryOption
	}{{"basic", harness.WithBasicAuth(user, pass)}, {"bearer", harness.WithBearerAuth(user, pass)}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			reg, d := start(t, "", mode.opt)
			cases := []struct {
				name   string
				auth   *runtimeapi.AuthConfig
				ok     bool
				bearer bool // token kinds only a bearer registry knows
			}{
				{"username-password", &runtimeapi.AuthConfig{Username: user, Password: pass}, true, false},
				{"auth-base64", &runtimeapi.AuthConfig{Auth: b64(user, pass)}, true, false},
				{"registry-token", &runtimeapi.AuthConfig{RegistryToken: reg.RegistryToken()}, true, true},
				{"identity-token", &runtimeapi.AuthConfig{IdentityToken: reg.IdentityToken()}, true, true},
				{"wrong-password", &runtimeapi.AuthConfig{Username: user, Password: "wrong"}, false, false},
				{"wrong-auth-base64", &runtimeapi.AuthConfig{Auth: b64(user, "wrong")}, false, false},
				{"no-credentials", nil, false, false},
			}
			for _, c := range cases {
				if c.bearer && mode.name != "bearer" {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					p := reg.Push(t, "private/busybox:"+c.name, img)
					if c.auth != nil {
						c.auth.ServerAddress = reg.Host()
					}
					got, err := pull(t, d, p.Name, c.auth)
					if c.ok {
						if err != nil || got != id {
							t.Fatalf("PullImage with %s = %q, %v; want %s", c.name, got, err, id)
						}
						mustStatus(t, d, p.Name)
						return
					}
					assertCode(t, err, []codes.Code{codes.Unauthenticated, codes.PermissionDenied}, "unauthorized")
					assertAbsent(t, d, p.Name)
				})
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
	t.Run("credentials-from-config-file", func(t *testing.T) {
		t.Parallel()
		harness.RequireIntegration(t)
		reg := harness.NewRegistry(t, harness.WithBearerAuth(user, pass))
		d := harness.StartDaemon(t, harness.Options{ConfigTOML: fmt.Sprintf(
			"[registry.%q]\nplain_http = true\nusername = %q\npassword = %q\n", reg.Host(), user, pass)})
		p := reg.Push(t, "private/busybox:config", img)
		mustPull(t, d, p.Name, id)
		harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
	})
}

func TestPullErrors(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	reg.Push(t, "berth/exists:1", img)
	h := reg.Host()
	unknownDigest := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		name, ref string
		code      codes.Code
		mention   []string
	}{
		{"unknown-repo", h + "/berth/nothere:1", codes.NotFound, []string{h + "/berth/nothere:1", "unknown"}},
		{"unknown-tag", h + "/berth/exists:2", codes.NotFound, []string{h + "/berth/exists:2", "unknown"}},
		{"unknown-digest", h + "/berth/exists@" + unknownDigest, codes.NotFound, []string{unknownDigest}},
		{"uppercase-repo", h + "/Berth/Busybox:1", codes.InvalidArgument, nil},
		{"two-tags", "busybox:1:2", codes.InvalidArgument, nil},
		{"short-digest", "busybox@sha256:1234", codes.InvalidArgument, nil},
		{"bad-digest-algorithm", "busybox@md5:d41d8cd98f00b204e9800998ecf8427e", codes.InvalidArgument, nil},
		{"empty-tag", "busybox:", codes.InvalidArgument, nil},
		{"double-slash", h + "//busybox:1", codes.InvalidArgument, nil},
		{"leading-dash", "-busybox", codes.InvalidArgument, nil},
		{"space", "busy box", codes.InvalidArgument, nil},
		{"empty", "", codes.InvalidArgument, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := pull(t, d, c.ref, nil)
			assertCode(t, err, one(c.code), c.mention...)
		})
	}
	if imgs := listImages(t, d, ""); len(imgs) != 0 {
		t.Errorf("failed pulls left %d images", len(imgs))
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

// badBlobCase breaks one blob of an image; the pull must fail, leave nothing
// behind, and succeed once the registry serves the blob right again.
type badBlobCase struct {
	name  string
	comp  harness.Compression
	blob  func(t *testing.T, img v1.Image) v1.Hash
	fault func(reg *harness.Registry, d v1.Hash, size int64)
}

func baseLayer(t *testing.T, img v1.Image) v1.Hash { return harness.LayerDigests(t, img)[0] }
func topLayer(t *testing.T, img v1.Image) v1.Hash  { return harness.LayerDigests(t, img)[1] }
func config(t *testing.T, img v1.Image) v1.Hash    { return harness.ConfigHash(t, img) }

func TestPullBadBlobs(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	cases := []badBlobCase{
		{"corrupt-gzip-layer", harness.Gzip, baseLayer,
			func(r *harness.Registry, d v1.Hash, _ int64) { r.Corrupt(d, -1) }},
		// The gzip header's MTIME: the layer still decompresses to the same
		// tar, only the compressed digest tells.
		{"corrupt-gzip-header", harness.Gzip, baseLayer,
			func(r *harness.Registry, d v1.Hash, _ int64) { r.Corrupt(d, 4) }},
		// Inside busybox's bytes: the tar stays valid, only the digests tell.
		{"corrupt-uncompressed-layer", harness.Uncompressed, baseLayer,
			func(r *harness.Registry, d v1.Hash, _ int64) { r.Corrupt(d, -1) }},
		{"corrupt-zstd-layer", harness.Zstd, baseLayer,
			func(r *harness.Registry, d v1.Hash, _ int64) { r.Corrupt(d, -1) }},
		{"corrupt-config", harness.Gzip, config,
			func(r *harness.Registry, d v1.Hash, _ int64) { r.Corrupt(d, -1) }},
		{"truncated-gzip-layer", harness.Gzip, baseLayer,
			func(r *harness.Registry, d v1.Hash, size int64) { r.Truncate(d, size/2) }},
		// Cut off just the end-of-archive blocks: every entry is complete, a
		// tar reader sees a clean end; only the size and digest checks catch it.
		{"truncated-uncompressed-layer-at-entry-boundary", harness.Uncompressed, topLayer,
			func(r *harness.Registry, d v1.Hash, size int64) { r.Truncate(d, size-1024) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, d := start(t, "")
			img := harness.BusyboxImage(t, harness.ImageSpec{Compression: c.comp,
				Layers: [][]harness.File{{harness.Reg("top", "top layer of "+c.name, 0o644)}}})
			p := reg.Push(t, "berth/bad:1", img)
			blob := c.blob(t, img)
			c.fault(reg, blob, harness.BlobSize(t, img, blob))

			if got, err := pull(t, d, p.Name, nil); err == nil {
				t.Fatalf("pull with a bad %s succeeded (%s)", blob, got)
			}
			if reg.Fetches(blob) == 0 {
				t.Fatalf("berthd never fetched the bad blob %s", blob)
			}
			assertAbsent(t, d, p.Name, p.ID, p.DigestRef())
			if imgs := listImages(t, d, ""); len(imgs) != 0 {
				t.Errorf("ListImages after a failed pull: %d images", len(imgs))
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))

			reg.Heal(blob)
			mustPull(t, d, p.Name, p.ID)
			if got := snapshotFile(t, d.Root, "top"); string(got) != "top layer of "+c.name {
				t.Errorf("top = %q after the retry", got)
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

func TestPullProgressTimeout(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const timeout = 2 * time.Second
	cases := []struct {
		name  string
		blob  func(t *testing.T, img v1.Image) v1.Hash
		after int64
	}{
		{"layer-stalls-before-first-byte", baseLayer, 0},
		{"layer-stalls-after-64KiB", baseLayer, 64 << 10},
		{"config-stalls", config, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, d := start(t, harness.ImageTOML(timeout.String()))
			img := harness.BusyboxImage(t, harness.ImageSpec{})
			p := reg.Push(t, "berth/stall:1", img)
			blob := c.blob(t, img)
			reg.Stall(blob, c.after)

			begin := time.Now()
			_, err := pullWithin(t, d, p.Name, nil, 15*timeout) // berthd must give up long before
			took := time.Since(begin)
			if err == nil {
				t.Fatal("a stalled pull succeeded")
			}
			assertCode(t, err, []codes.Code{codes.DeadlineExceeded, codes.Unavailable, codes.Aborted}, "progress")
			if took < timeout-200*time.Millisecond || took > 5*timeout {
				t.Errorf("stalled pull failed after %s, want about %s (the progress timeout)", took, timeout)
			}
			assertAbsent(t, d, p.Name)
			harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))

			reg.Heal(blob)
			mustPull(t, d, p.Name, p.ID)
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

func TestPullSlowButProgressingSucceeds(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const timeout = 2 * time.Second
	reg, d := start(t, harness.ImageTOML(timeout.String()))
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	p := reg.Push(t, "berth/slow:1", img)
	layer := baseLayer(t, img)
	// 12 chunks 400 ms apart: about 4.4 s in all, never 2 s without a byte.
	reg.Trickle(layer, int(harness.BlobSize(t, img, layer)/12)+1, 400*time.Millisecond)
	begin := time.Now()
	mustPull(t, d, p.Name, p.ID)
	if took := time.Since(begin); took < 2*timeout {
		t.Errorf("the trickled pull took only %s; the test did not exercise the timeout", took)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

func TestSharedLayerFetchedAndStoredOnce(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	a := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("a", "a", 0o644)}}})
	b := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("b", "b", 0o644)}}})
	pa, pb := reg.Push(t, "berth/a:1", a), reg.Push(t, "berth/b:1", b)
	reg.ResetFetches()
	mustPull(t, d, pa.Name, pa.ID)
	mustPull(t, d, pb.Name, pb.ID)
	if n := reg.Fetches(baseLayer(t, a)); n != 1 {
		t.Errorf("the shared busybox layer was fetched %d times, want 1", n)
	}
	if hits := harness.FindInSnapshots(t, d.Root, "bin/busybox"); len(hits) != 1 {
		t.Errorf("bin/busybox is stored in %d snapshots, want 1: %v", len(hits), hits)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, a, b)) // 3 snapshots
}

func TestConcurrentPullsFetchOnce(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	cases := []struct {
		name   string
		images int // distinct images (sharing the busybox layer)
		each   int // concurrent pulls per image
	}{
		{"one-image-4-pulls", 1, 4},
		{"two-images-sharing-a-layer-2-pulls-each", 2, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, d := start(t, "")
			var imgs []v1.Image
			var pushed []harness.Pushed
			for i := range c.images {
				img := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("which", fmt.Sprint(i), 0o644)}}})
				imgs = append(imgs, img)
				// One repository: pulls share a blob's download within a
				// source (registry and repository) only.
				pushed = append(pushed, reg.Push(t, fmt.Sprintf("berth/concurrent:%d", i), img))
			}
			base := baseLayer(t, imgs[0])
			// Slow the shared layer down (about 1 s) so that the pulls overlap.
			reg.Trickle(base, int(harness.BlobSize(t, imgs[0], base)/5)+1, 250*time.Millisecond)
			reg.ResetFetches()

			var wg sync.WaitGroup
			errs := make(chan error, c.images*c.each)
			for _, p := range pushed {
				for range c.each {
					wg.Go(func() {
						got, err := pull(t, d, p.Name, nil)
						if err == nil && got != p.ID {
							err = fmt.Errorf("image_ref %s, want %s", got, p.ID)
						}
						if err != nil {
							errs <- fmt.Errorf("pull %s: %w", p.Name, err)
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for _, img := range imgs {
				blobs := append(harness.LayerDigests(t, img), harness.ConfigHash(t, img))
				for _, b := range blobs {
					if n := reg.Fetches(b); n != 1 {
						t.Errorf("blob %s fetched %d times by %d concurrent pulls, want 1", b, n, c.images*c.each)
					}
				}
			}
			if hits := harness.FindInSnapshots(t, d.Root, "bin/busybox"); len(hits) != 1 {
				t.Errorf("bin/busybox is stored in %d snapshots, want 1", len(hits))
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, imgs...))
		})
	}
}

func TestPullFetchesLayersInParallel(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	var layers [][]harness.File
	for i := range 3 {
		layers = append(layers, []harness.File{harness.Reg(fmt.Sprint("layer", i), strings.Repeat("x", 4096), 0o644)})
	}
	img := harness.BusyboxImage(t, harness.ImageSpec{Layers: layers})
	p := reg.Push(t, "berth/parallel:1", img)
	for _, l := range harness.LayerDigests(t, img) {
		reg.Trickle(l, int(harness.BlobSize(t, img, l)/4)+1, 250*time.Millisecond) // about 1 s each
	}
	reg.ResetFetches()
	mustPull(t, d, p.Name, p.ID)
	if n := reg.MaxInFlight(); n < 2 {
		t.Errorf("at most %d layer fetched at a time; want layers fetched in parallel", n)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestPullStreamsIntoUnpacker watches the snapshots folder during a slow pull:
// the layer's files must appear in its in-progress snapshot while its blob is
// still arriving, not after a download to a temp file.
func TestPullStreamsIntoUnpacker(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	p := reg.Push(t, "berth/stream:1", img)
	layer := baseLayer(t, img)
	reg.Trickle(layer, int(harness.BlobSize(t, img, layer)/20)+1, 150*time.Millisecond) // about 3 s

	done := make(chan error, 1)
	c := ctx(t)
	go func() {
		_, err := d.Images.PullImage(c, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: p.Name}})
		done <- err
	}()
	partial := filepath.Join(d.Root, harness.SnapshotsDir, "tmp-*", "fs", "bin", "busybox")
	streamed := false
	for finished := false; !finished; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("pull: %v", err)
			}
			finished = true
		case <-time.After(20 * time.Millisecond):
			if m, _ := filepath.Glob(partial); len(m) > 0 && reg.InFlight() > 0 {
				streamed = true
			}
		}
	}
	if !streamed {
		t.Errorf("no %s appeared while the layer was still being fetched: layers are not streamed into the unpacker", partial)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestPullRejectsLyingDiffID pulls an image whose layer blob matches its
// manifest digest but whose config names another diff ID.
func TestPullRejectsLyingDiffID(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	img := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("lying", "x", 0o644)}}})
	bogus := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}
	p := reg.PushWithConfig(t, "berth/lying:1", img, func(cf *v1.ConfigFile) { cf.RootFS.DiffIDs[1] = bogus })
	if got, err := pull(t, d, p.Name, nil); err == nil {
		t.Fatalf("pull of an image with a lying diff ID succeeded (%s)", got)
	}
	assertAbsent(t, d, p.Name, p.ID)
	if hits := harness.FindInSnapshots(t, d.Root, "lying"); len(hits) != 0 {
		t.Errorf("the layer with the wrong diff ID was committed: %v", hits)
	}
	harness.AssertNoLeaks(t, d.Root)
}

// TestPullHostileLayerStaysInSnapshot pulls layers whose entries aim outside
// their snapshot. Whether berthd refuses the image or skips the entries,
// nothing may be written outside the snapshot.
func TestPullHostileLayerStaysInSnapshot(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	up := strings.Repeat("../", 24)
	cases := []struct {
		name   string
		layers func(out, sentinel string) [][]harness.File
	}{
		{"dotdot", func(out, _ string) [][]harness.File {
			return [][]harness.File{{harness.Reg(up+out[1:]+"/dotdot", "escaped", 0o644)}}
		}},
		{"absolute-name", func(out, _ string) [][]harness.File {
			return [][]harness.File{{harness.Reg(out+"/absolute", "escaped", 0o644)}}
		}},
		{"through-absolute-symlink", func(out, _ string) [][]harness.File {
			return [][]harness.File{{harness.Symlink("esc", out), harness.Reg("esc/via-symlink", "escaped", 0o644)}}
		}},
		{"through-relative-symlink", func(out, _ string) [][]harness.File {
			return [][]harness.File{{harness.Symlink("esc", up+out[1:]), harness.Reg("esc/via-relative-symlink", "escaped", 0o644)}}
		}},
		{"through-symlink-of-lower-layer", func(out, _ string) [][]harness.File {
			return [][]harness.File{{harness.Symlink("esc", out)}, {harness.Reg("esc/via-lower-symlink", "escaped", 0o644)}}
		}},
		{"hardlink-outside", func(_, sentinel string) [][]harness.File {
			return [][]harness.File{{harness.Hardlink("hl", up+sentinel[1:]), harness.Hardlink("hl-abs", sentinel)}}
		}},
		{"hardlink-through-symlink", func(_, sentinel string) [][]harness.File {
			return [][]harness.File{{harness.Symlink("d", filepath.Dir(sentinel)), harness.Hardlink("hl", "d/"+filepath.Base(sentinel))}}
		}},
		{"symlink-then-file-replaces-target", func(_, sentinel string) [][]harness.File {
			return [][]harness.File{{harness.Symlink("victim", sentinel), harness.Reg("victim", "overwritten", 0o644)}}
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			sentinel := filepath.Join(t.TempDir(), "sentinel")
			if err := os.WriteFile(sentinel, []byte("host file"), 0o644); err != nil {
				t.Fatal(err)
			}
			img := harness.BusyboxImage(t, harness.ImageSpec{Layers: c.layers(out, sentinel)})
			p := reg.Push(t, fmt.Sprintf("berth/hostile:%d", i), img)
			_, err := pull(t, d, p.Name, nil)
			t.Logf("pull: %v", err)
			if es, _ := os.ReadDir(out); len(es) != 0 {
				t.Errorf("the layer wrote outside its snapshot: %s has %v", out, names(es))
			}
			var st syscall.Stat_t
			if err := syscall.Stat(sentinel, &st); err != nil || st.Nlink != 1 {
				t.Errorf("the host file %s got linked from a snapshot (nlink %d, %v)", sentinel, st.Nlink, err)
			}
			if b, _ := os.ReadFile(sentinel); string(b) != "host file" {
				t.Errorf("the host file %s was overwritten: %q", sentinel, b)
			}
			if err != nil {
				assertAbsent(t, d, p.Name)
			}
		})
	}
	harness.AssertNoLeaks(t, d.Root)
}

func names(es []fs.DirEntry) []string {
	var ns []string
	for _, e := range es {
		ns = append(ns, e.Name())
	}
	return ns
}

// TestPullRefusesLayerBombs pulls layers over berthd's configured bounds: a
// gzip and a zstd bomb (a few KiB that unpack to 32 MiB) and a layer of more
// entries than allowed. Each pull fails naming the bound, and leaves nothing.
func TestPullRefusesLayerBombs(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	zeros := string(make([]byte, 32<<20))
	var many []harness.File
	for i := range 301 {
		many = append(many, harness.Reg(fmt.Sprintf("f%d", i), "", 0o644))
	}
	cases := []struct {
		name  string
		comp  harness.Compression
		files []harness.File
		want  string
	}{
		{"gzip-bomb", harness.Gzip, []harness.File{harness.Reg("zeros", zeros, 0o644)}, "more than 4194304 bytes"},
		{"zstd-bomb", harness.Zstd, []harness.File{harness.Reg("zeros", zeros, 0o644)}, "more than 4194304 bytes"},
		{"too-many-entries", harness.Gzip, many, "more than 300 entries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, d := start(t, "[image]\nmax_layer_bytes = 4194304\nmax_layer_entries = 300\n")
			img := harness.BusyboxImage(t, harness.ImageSpec{Compression: c.comp, Layers: [][]harness.File{c.files}})
			p := reg.Push(t, "berth/bomb:1", img)
			if size := harness.BlobSize(t, img, topLayer(t, img)); size > 1<<20 {
				t.Fatalf("the hostile layer is %d bytes compressed; the test wants a small one", size)
			}
			_, err := pull(t, d, p.Name, nil)
			if err == nil || !strings.Contains(err.Error(), "layer too large") || !strings.Contains(err.Error(), c.want) ||
				!strings.Contains(err.Error(), "max_layer_bytes") || status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("pull = %v; want FailedPrecondition, a layer too large error with %q, naming the config keys", err, c.want)
			}
			assertAbsent(t, d, p.Name, p.ID)
			harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
		})
	}
}

// TestPullRefusesHugeConfig pulls an image whose config is over the bound:
// berthd refuses it from the manifest's descriptor, never fetching the config.
func TestPullRefusesHugeConfig(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	p := reg.PushWithConfig(t, "berth/hugeconfig:1", img, func(cf *v1.ConfigFile) {
		cf.Config.Labels = map[string]string{"big": strings.Repeat("x", 5<<20)}
	})
	cfg, err := v1.NewHash(p.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pull(t, d, p.Name, nil)
	if err == nil || !strings.Contains(err.Error(), "more than the 4194304 an image config may have") {
		t.Fatalf("pull = %v; want a refusal naming the config bound", err)
	}
	if n := reg.Fetches(cfg); n != 0 {
		t.Errorf("the oversized config was fetched %d times", n)
	}
	assertAbsent(t, d, p.Name, p.ID)
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

// TestPullCredentialsStayHome pulls through two mirrors that require
// credentials of their own: the kubelet's credentials go only to the
// registry the image names, a mirror gets only what its own table configures.
func TestPullCredentialsStayHome(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	home := harness.NewRegistry(t, harness.WithBasicAuth("alice", "s3cret"))
	configured := harness.NewRegistry(t, harness.WithBasicAuth("mirror", "mpw"))
	bare := harness.NewRegistry(t, harness.WithBasicAuth("other", "opw"))
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.RegistryTOML(map[string]harness.HostConfig{
		home.Host():       {PlainHTTP: true, Mirrors: []string{configured.URL(), bare.URL()}},
		configured.Host(): {PlainHTTP: true, Username: "mirror", Password: "mpw"},
		bare.Host():       {PlainHTTP: true},
	})})
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	p := home.Push(t, "private/busybox:1", img) // on neither mirror: both are asked, then home
	_, err := pull(t, d, p.Name, &runtimeapi.AuthConfig{Username: "alice", Password: "s3cret", ServerAddress: home.Host()})
	if err != nil {
		t.Fatalf("PullImage: %v", err)
	}
	if got := configured.CredentialUsers(); len(got) == 0 || slices.ContainsFunc(got, func(u string) bool { return u != "mirror" }) {
		t.Errorf("the mirror with configured credentials received users %v, want only its own (mirror)", got)
	}
	if got := bare.CredentialUsers(); len(got) != 0 {
		t.Errorf("the mirror without configured credentials received users %v, want none", got)
	}
	if got := home.CredentialUsers(); !slices.Contains(got, "alice") {
		t.Errorf("the image's registry received users %v, want alice", got)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

// TestPullRegistryFaults pulls while the registry misbehaves on one blob:
// each pull fails with an error that says what went wrong, leaves nothing
// behind, and succeeds once the registry heals.
func TestPullRegistryFaults(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	cases := []struct {
		name  string
		blob  func(*testing.T, v1.Image) v1.Hash
		fault func(*harness.Registry, v1.Hash)
		want  string
	}{
		{"5xx-on-layer", baseLayer, func(r *harness.Registry, d v1.Hash) { r.Fail(d, http.StatusServiceUnavailable) }, "injected failure"},
		{"5xx-on-config", config, func(r *harness.Registry, d v1.Hash) { r.Fail(d, http.StatusInternalServerError) }, "injected failure"},
		{"redirect-loop", baseLayer, func(r *harness.Registry, d v1.Hash) { r.RedirectLoop(d) }, "stopped after 10 redirects"},
		{"content-length-too-long", baseLayer, func(r *harness.Registry, d v1.Hash) { r.LieLength(d, 4096) }, "Content-Length"},
		{"content-length-too-short", topLayer, func(r *harness.Registry, d v1.Hash) { r.LieLength(d, -16) }, "Content-Length"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg, d := start(t, "")
			img := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("top", c.name, 0o644)}}})
			p := reg.Push(t, "berth/faulty:1", img)
			blob := c.blob(t, img)
			c.fault(reg, blob)
			_, err := pull(t, d, p.Name, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("pull = %v; want an error mentioning %q", err, c.want)
			}
			if reg.Fetches(blob) == 0 {
				t.Fatalf("berthd never asked for the faulty blob %s", blob)
			}
			assertAbsent(t, d, p.Name, p.ID)
			harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))

			reg.Heal(blob)
			mustPull(t, d, p.Name, p.ID)
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}
