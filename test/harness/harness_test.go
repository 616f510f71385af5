package harness

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// These tests need no privileges: they prove the fixtures with
// go-containerregistry's own client, so that a failing integration test points
// at berth and not at the harness.

func requireBusybox(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("%s missing (apt-get install -y busybox-static)", BusyboxPath)
	}
}

// validateImage reads every blob of img: go-containerregistry's remote reader
// checks each against its digest; the diff IDs are checked here.
func validateImage(img v1.Image) error {
	if _, err := img.RawConfigFile(); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
		diff, err := l.DiffID()
		if err != nil {
			return err
		}
		rc, err = l.Uncompressed()
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, rc)
		rc.Close()
		if err != nil {
			return err
		}
		if got := fmt.Sprintf("sha256:%x", h.Sum(nil)); got != diff.String() {
			return fmt.Errorf("layer diff ID %s, config says %s", got, diff)
		}
	}
	return nil
}

func pullRef(t *testing.T, ref string, opts ...remote.Option) (v1.Image, error) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	return remote.Image(r, opts...)
}

// extractFile returns the content of path in img's flattened filesystem.
func extractFile(t *testing.T, img v1.Image, path string) ([]byte, bool) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name == path {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b, true
		}
	}
}

func TestRegistryRoundTrip(t *testing.T) {
	requireBusybox(t)
	reg := NewRegistry(t)
	cases := []struct {
		format      Format
		compression Compression
		manifest    types.MediaType
		layer       types.MediaType
	}{
		{OCI, Gzip, types.OCIManifestSchema1, types.OCILayer},
		{OCI, Zstd, types.OCIManifestSchema1, types.OCILayerZStd},
		{OCI, Uncompressed, types.OCIManifestSchema1, types.OCIUncompressedLayer},
		{Docker, Gzip, types.DockerManifestSchema2, types.DockerLayer},
		{Docker, Uncompressed, types.DockerManifestSchema2, types.DockerUncompressedLayer},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s-%s", c.format, c.compression), func(t *testing.T) {
			img := BusyboxImage(t, ImageSpec{Format: c.format, Compression: c.compression,
				Layers: [][]File{{Dir("opt", 0o755), Reg("opt/hello", "hello\n", 0o600), Whiteout("etc/group")}},
				Config: v1.Config{User: "1002", Env: []string{"A=b"}}})
			p := reg.Push(t, fmt.Sprintf("roundtrip/%s:%s", c.format, c.compression), img)
			got, err := pullRef(t, p.Name)
			if err != nil {
				t.Fatalf("pull %s: %v", p.Name, err)
			}
			if err := validateImage(got); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if d := ManifestDigest(t, got); d != p.Digest {
				t.Errorf("manifest digest %s, pushed %s", d, p.Digest)
			}
			if id := ConfigDigest(t, got); id != p.ID {
				t.Errorf("config digest %s, pushed %s", id, p.ID)
			}
			m, err := got.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.MediaType != c.manifest {
				t.Errorf("manifest media type %s, want %s", m.MediaType, c.manifest)
			}
			for _, l := range m.Layers {
				if l.MediaType != c.layer {
					t.Errorf("layer media type %s, want %s", l.MediaType, c.layer)
				}
			}
			if len(m.Layers) != 2 {
				t.Errorf("%d layers, want 2", len(m.Layers))
			}
			cf, err := got.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Config.User != "1002" || cf.Architecture != "amd64" || cf.OS != "linux" {
				t.Errorf("config user %q platform %s/%s", cf.Config.User, cf.OS, cf.Architecture)
			}
			bb, ok := extractFile(t, got, "bin/busybox")
			if !ok || !bytes.Equal(bb, BusyboxBinary(t)) {
				t.Errorf("bin/busybox missing or different in the pulled image")
			}
			if _, ok := extractFile(t, got, "etc/group"); ok {
				t.Errorf("etc/group survived its whiteout")
			}
			if b, _ := extractFile(t, got, "opt/hello"); string(b) != "hello\n" {
				t.Errorf("opt/hello = %q", b)
			}
		})
	}
}

func TestRegistryIndex(t *testing.T) {
	requireBusybox(t)
	reg := NewRegistry(t)
	for _, c := range []struct {
		format Format
		mt     types.MediaType
	}{{OCI, types.OCIImageIndex}, {Docker, types.DockerManifestList}} {
		t.Run(c.format.String(), func(t *testing.T) {
			amd64 := BusyboxImage(t, ImageSpec{Format: c.format})
			idx := Index(t, c.format, amd64)
			p := reg.PushIndex(t, "index/"+c.format.String()+":multi", idx)
			if p.ID != ConfigDigest(t, amd64) {
				t.Errorf("Pushed.ID %s, want the amd64 config %s", p.ID, ConfigDigest(t, amd64))
			}
			r, _ := name.ParseReference(p.Name)
			gotIdx, err := remote.Index(r)
			if err != nil {
				t.Fatal(err)
			}
			im, err := gotIdx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if im.MediaType != c.mt || len(im.Manifests) != 3 {
				t.Fatalf("index %s with %d entries", im.MediaType, len(im.Manifests))
			}
			if last := im.Manifests[2].Platform; last == nil || last.Architecture != "amd64" {
				t.Errorf("amd64 is not the last entry: %+v", last)
			}
			for _, pf := range []Platform{AMD64, ARM64, ARMv7} {
				img, err := pullRef(t, p.Name, remote.WithPlatform(pf))
				if err != nil {
					t.Fatalf("pull %s for %s: %v", p.Name, pf, err)
				}
				if err := validateImage(img); err != nil {
					t.Fatal(err)
				}
				cf, _ := img.ConfigFile()
				if cf.Architecture != pf.Architecture {
					t.Errorf("pulled %s for %s", cf.Architecture, pf)
				}
				_, hasBusybox := extractFile(t, img, "bin/busybox")
				if hasBusybox != (pf.Architecture == "amd64") {
					t.Errorf("%s: has busybox %v", pf, hasBusybox)
				}
			}
		})
	}
}

func TestRegistryAuth(t *testing.T) {
	requireBusybox(t)
	img := BusyboxImage(t, ImageSpec{})
	basic := func(u, p string) authn.Authenticator { return &authn.Basic{Username: u, Password: p} }
	fromAuth := func(u, p string) authn.Authenticator {
		return authn.FromConfig(authn.AuthConfig{Auth: base64.StdEncoding.EncodeToString([]byte(u + ":" + p))})
	}
	for _, mode := range []struct {
		name string
		opt  RegistryOption
	}{{"basic", WithBasicAuth("alice", "s3cret")}, {"bearer", WithBearerAuth("alice", "s3cret")}} {
		t.Run(mode.name, func(t *testing.T) {
			reg := NewRegistry(t, mode.opt)
			p := reg.Push(t, "private/busybox:1", img)
			cases := []struct {
				name   string
				auth   authn.Authenticator
				ok     bool
				bearer bool // only meaningful with bearer auth
			}{
				{"user-password", basic("alice", "s3cret"), true, false},
				{"auth-field", fromAuth("alice", "s3cret"), true, false},
				{"wrong-password", basic("alice", "nope"), false, false},
				{"anonymous", authn.Anonymous, false, false},
				{"registry-token", authn.FromConfig(authn.AuthConfig{RegistryToken: reg.RegistryToken()}), true, true},
				{"identity-token", authn.FromConfig(authn.AuthConfig{IdentityToken: reg.IdentityToken()}), true, true},
				{"bad-identity-token", authn.FromConfig(authn.AuthConfig{IdentityToken: "nope"}), false, true},
			}
			for _, c := range cases {
				if c.bearer && mode.name != "bearer" {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					got, err := pullRef(t, p.Name, remote.WithAuth(c.auth))
					if err == nil {
						err = validateImage(got)
					}
					switch {
					case c.ok && err != nil:
						t.Fatalf("pull: %v", err)
					case !c.ok && err == nil:
						t.Fatal("pull succeeded without valid credentials")
					case !c.ok && !strings.Contains(strings.ToUpper(err.Error()), "UNAUTHORIZED"):
						t.Errorf("error does not say unauthorized: %v", err)
					}
				})
			}
			// The challenge is what a client sees first.
			resp, err := http.Get(reg.URL() + "/v2/private/busybox/manifests/1")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			ch := resp.Header.Get("WWW-Authenticate")
			want := `Basic realm=`
			if mode.name == "bearer" {
				want = fmt.Sprintf(`Bearer realm="%s/token",service="%s",scope="repository:private/busybox:pull"`, reg.URL(), Service)
			}
			if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(ch, want) {
				t.Errorf("unauthenticated GET: %d %q, want 401 %q", resp.StatusCode, ch, want)
			}
		})
	}
}

// getBlob fetches blob d of repo with a plain HTTP client.
func getBlob(t *testing.T, reg *Registry, repo string, d v1.Hash, timeout time.Duration, rangeHdr string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v2/%s/blobs/%s", reg.URL(), repo, d), nil)
	if rangeHdr != "" {
		req.Header.Set("Range", rangeHdr)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	return io.ReadAll(resp.Body)
}

func TestRegistryFaults(t *testing.T) {
	requireBusybox(t)
	img := BusyboxImage(t, ImageSpec{})
	layer := LayerDigests(t, img)[0]
	size := BlobSize(t, img, layer)
	l, _ := img.LayerByDigest(layer)
	rc, _ := l.Compressed()
	orig, _ := io.ReadAll(rc)
	rc.Close()

	cases := []struct {
		name    string
		fault   func(r *Registry)
		rng     string // Range header
		timeout time.Duration
		check   func(t *testing.T, got []byte, err error, elapsed time.Duration)
	}{
		{"corrupt-middle", func(r *Registry) { r.Corrupt(layer, -1) }, "", 10 * time.Second,
			func(t *testing.T, got []byte, err error, _ time.Duration) {
				if err != nil || int64(len(got)) != size {
					t.Fatalf("got %d bytes, %v; want all %d", len(got), err, size)
				}
				if sha256.Sum256(got) == sha256.Sum256(orig) {
					t.Fatal("content not corrupted")
				}
				diff := 0
				for i := range got {
					if got[i] != orig[i] {
						diff++
						if int64(i) != size/2 {
							t.Errorf("byte %d changed, want %d", i, size/2)
						}
					}
				}
				if diff != 1 {
					t.Errorf("%d bytes changed, want 1", diff)
				}
			}},
		{"corrupt-in-range", func(r *Registry) { r.Corrupt(layer, 100) }, "bytes=90-109", 10 * time.Second,
			func(t *testing.T, got []byte, err error, _ time.Duration) {
				if err != nil || len(got) != 20 || got[10] != orig[100]^0xff || !bytes.Equal(got[:10], orig[90:100]) {
					t.Fatalf("ranged corrupt read: %v %x", err, got)
				}
			}},
		{"truncate", func(r *Registry) { r.Truncate(layer, 1000) }, "", 10 * time.Second,
			func(t *testing.T, got []byte, err error, _ time.Duration) {
				if !errors.Is(err, io.ErrUnexpectedEOF) || len(got) != 1000 || !bytes.Equal(got, orig[:1000]) {
					t.Fatalf("got %d bytes, %v; want the first 1000 then unexpected EOF", len(got), err)
				}
			}},
		{"truncate-resume-gets-nothing", func(r *Registry) { r.Truncate(layer, 1000) }, fmt.Sprintf("bytes=1000-%d", size-1), 10 * time.Second,
			func(t *testing.T, got []byte, err error, _ time.Duration) {
				if err == nil || len(got) != 0 {
					t.Fatalf("resume past the cut: %d bytes, %v", len(got), err)
				}
			}},
		{"stall", func(r *Registry) { r.Stall(layer, 4096) }, "", 700 * time.Millisecond,
			func(t *testing.T, got []byte, err error, elapsed time.Duration) {
				if !errors.Is(err, context.DeadlineExceeded) || len(got) != 4096 || elapsed < 600*time.Millisecond {
					t.Fatalf("got %d bytes, %v after %s; want 4096 then a client timeout", len(got), err, elapsed)
				}
			}},
		{"trickle", func(r *Registry) { r.Trickle(layer, int(size/5)+1, 200*time.Millisecond) }, "", 10 * time.Second,
			func(t *testing.T, got []byte, err error, elapsed time.Duration) {
				if err != nil || !bytes.Equal(got, orig) {
					t.Fatalf("trickle: %d bytes, %v", len(got), err)
				}
				if elapsed < 750*time.Millisecond {
					t.Errorf("trickle took %s, want about 800ms", elapsed)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg := NewRegistry(t)
			reg.Push(t, "faults/busybox:1", img)
			c.fault(reg)
			start := time.Now()
			got, err := getBlob(t, reg, "faults/busybox", layer, c.timeout, c.rng)
			c.check(t, got, err, time.Since(start))
			if n := reg.Fetches(layer); n != 1 {
				t.Errorf("fetch counter %d, want 1", n)
			}
			reg.Heal(layer)
			if got, err := getBlob(t, reg, "faults/busybox", layer, 10*time.Second, ""); err != nil || !bytes.Equal(got, orig) {
				t.Errorf("after Heal: %d bytes, %v", len(got), err)
			}
		})
	}

	t.Run("client-sees-corruption", func(t *testing.T) {
		reg := NewRegistry(t)
		p := reg.Push(t, "faults/busybox:1", img)
		reg.Corrupt(layer, -1)
		got, err := pullRef(t, p.Name)
		if err == nil {
			err = validateImage(got)
		}
		if err == nil {
			t.Fatal("a corrupted layer passed go-containerregistry's validation")
		}
	})
}

func TestFetchCounter(t *testing.T) {
	requireBusybox(t)
	reg := NewRegistry(t)
	base := BusyboxImage(t, ImageSpec{})
	a := BusyboxImage(t, ImageSpec{Layers: [][]File{{Reg("a", "a", 0o644)}}})
	b := BusyboxImage(t, ImageSpec{Layers: [][]File{{Reg("b", "b", 0o644)}}})
	reg.Push(t, "shared/a:1", a)
	reg.Push(t, "shared/b:1", b)
	baseLayer := LayerDigests(t, base)[0]
	if LayerDigests(t, a)[0] != baseLayer || LayerDigests(t, b)[0] != baseLayer {
		t.Fatal("images built on busybox do not share its layer digest")
	}
	reg.ResetFetches()
	for _, repo := range []string{"shared/a", "shared/b"} {
		if _, err := getBlob(t, reg, repo, baseLayer, 10*time.Second, ""); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := http.Head(fmt.Sprintf("%s/v2/shared/a/blobs/%s", reg.URL(), baseLayer)); err == nil {
		resp.Body.Close()
	}
	if n := reg.Fetches(baseLayer); n != 2 {
		t.Errorf("2 GETs and a HEAD counted %d, want 2", n)
	}
	if n := reg.Fetches(LayerDigests(t, a)[1]); n != 0 {
		t.Errorf("unfetched layer counted %d", n)
	}
	if len(reg.Requests()) == 0 {
		t.Error("request log is empty")
	}

	// Two slow GETs at once count as two in flight.
	reg.ResetFetches()
	reg.Trickle(baseLayer, int(BlobSize(t, base, baseLayer)/3)+1, 150*time.Millisecond)
	done := make(chan error, 2)
	for _, repo := range []string{"shared/a", "shared/b"} {
		go func() {
			_, err := getBlob(t, reg, repo, baseLayer, 10*time.Second, "")
			done <- err
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := reg.MaxInFlight(); n != 2 {
		t.Errorf("MaxInFlight = %d, want 2", n)
	}
	// The handler counts a GET done once it returns, just after the client
	// read the last byte.
	deadline := time.Now().Add(2 * time.Second)
	for reg.InFlight() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := reg.InFlight(); n != 0 {
		t.Errorf("InFlight = %d after all GETs ended", n)
	}
}

func TestPushWithConfig(t *testing.T) {
	requireBusybox(t)
	reg := NewRegistry(t)
	img := BusyboxImage(t, ImageSpec{Layers: [][]File{{Reg("x", "x", 0o644)}}})
	bogus := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}
	p := reg.PushWithConfig(t, "lies/diffid:1", img, func(cf *v1.ConfigFile) { cf.RootFS.DiffIDs[1] = bogus })
	r, _ := name.ParseReference(p.Name)
	desc, err := remote.Get(r)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest.String() != p.Digest {
		t.Errorf("manifest digest %s, Pushed says %s", desc.Digest, p.Digest)
	}
	got, err := desc.Image()
	if err != nil {
		t.Fatal(err)
	}
	if id := ConfigDigest(t, got); id != p.ID || id == ConfigDigest(t, img) {
		t.Errorf("config %s, Pushed.ID %s, original %s", id, p.ID, ConfigDigest(t, img))
	}
	cf, _ := got.ConfigFile()
	if cf.RootFS.DiffIDs[1] != bogus {
		t.Errorf("diff IDs %v", cf.RootFS.DiffIDs)
	}
	m, _ := got.Manifest()
	if len(m.Layers) != 2 || m.Layers[1].Digest != LayerDigests(t, img)[1] {
		t.Errorf("layers changed: %v", m.Layers)
	}
}

func TestTarEntries(t *testing.T) {
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	files := []File{
		Dir("opt/dir", 0o750),
		{Path: "opt/suid", Content: []byte("x"), Mode: 0o4755, UID: 1002, GID: 1003, ModTime: mtime,
			Xattrs: map[string]string{"user.berth": "yes"}},
		Symlink("opt/link", "suid"),
		Hardlink("opt/hard", "opt/suid"),
		Whiteout("etc/gone"),
		OpaqueWhiteout("opt/dir"),
		{Path: "dev/null", Type: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
	}
	want := []tar.Header{
		{Name: "opt/dir/", Typeflag: tar.TypeDir, Mode: 0o750},
		{Name: "opt/suid", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1002, Gid: 1003, Size: 1, ModTime: mtime},
		{Name: "opt/link", Typeflag: tar.TypeSymlink, Linkname: "suid", Mode: 0o777},
		{Name: "opt/hard", Typeflag: tar.TypeLink, Linkname: "opt/suid"},
		{Name: "etc/.wh.gone", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "opt/dir/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
	}
	tr := tar.NewReader(bytes.NewReader(TarBytes(t, files)))
	for i, w := range want {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if h.Name != w.Name || h.Typeflag != w.Typeflag || h.Mode != w.Mode || h.Uid != w.Uid ||
			h.Gid != w.Gid || h.Linkname != w.Linkname || h.Size != w.Size ||
			h.Devmajor != w.Devmajor || h.Devminor != w.Devminor {
			t.Errorf("entry %d: %+v, want %+v", i, h, w)
		}
		if !w.ModTime.IsZero() && !h.ModTime.Equal(w.ModTime) {
			t.Errorf("entry %d mtime %s, want %s", i, h.ModTime, w.ModTime)
		}
		if w.Name == "opt/suid" && h.PAXRecords["SCHILY.xattr.user.berth"] != "yes" {
			t.Errorf("xattr missing: %v", h.PAXRecords)
		}
	}
	if _, err := tr.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("extra entries: %v", err)
	}
}

func TestChainIDs(t *testing.T) {
	img := NewImage(t, ImageSpec{Compression: Uncompressed, Layers: [][]File{{Reg("a", "a", 0)}, {Reg("b", "b", 0)}}})
	cf, _ := img.ConfigFile()
	ids := ChainIDs(t, img)
	if len(ids) != 2 || ids[0] != cf.RootFS.DiffIDs[0].String() {
		t.Fatalf("chain IDs %v for diff IDs %v", ids, cf.RootFS.DiffIDs)
	}
	sum := sha256.Sum256([]byte(ids[0] + " " + cf.RootFS.DiffIDs[1].String()))
	if ids[1] != fmt.Sprintf("sha256:%x", sum) {
		t.Errorf("chain ID 1 = %s", ids[1])
	}
	if n := len(DistinctChainIDs(t, img, img)); n != 2 {
		t.Errorf("distinct chains of the same image twice: %d", n)
	}
	// Same files, same digest: layers are deterministic.
	if again := NewImage(t, ImageSpec{Compression: Uncompressed, Layers: [][]File{{Reg("a", "a", 0)}, {Reg("b", "b", 0)}}}); ConfigDigest(t, again) != ConfigDigest(t, img) {
		t.Error("building the same image twice gave two config digests")
	}
}

func TestImportFormats(t *testing.T) {
	requireBusybox(t)
	img := BusyboxImage(t, ImageSpec{Layers: [][]File{{Reg("imported", "yes", 0o644)}}})
	dir := t.TempDir()

	WriteOCILayout(t, filepath.Join(dir, "oci"), "docker.io/berth/imported:oci", img)
	idx, err := layout.ImageIndexFromPath(filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	im, _ := idx.IndexManifest()
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "docker.io/berth/imported:oci" {
		t.Fatalf("layout index: %+v", im.Manifests)
	}
	got, err := idx.Image(im.Manifests[0].Digest)
	if err != nil || validateImage(got) != nil || ConfigDigest(t, got) != ConfigDigest(t, img) {
		t.Fatalf("layout image: %v", err)
	}

	WriteOCILayout(t, filepath.Join(dir, "oci-index"), "docker.io/berth/imported:multi", Index(t, OCI, img))
	idx, err = layout.ImageIndexFromPath(filepath.Join(dir, "oci-index"))
	if err != nil {
		t.Fatal(err)
	}
	im, _ = idx.IndexManifest()
	if len(im.Manifests) != 1 || im.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("layout with an index: %+v", im.Manifests)
	}

	tarPath := filepath.Join(dir, "save.tar")
	WriteDockerSave(t, tarPath, "docker.io/berth/imported:docker", img)
	tag, _ := name.NewTag("docker.io/berth/imported:docker")
	saved, err := tarball.ImageFromPath(tarPath, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if ConfigDigest(t, saved) != ConfigDigest(t, img) {
		t.Errorf("docker save config %s, want %s", ConfigDigest(t, saved), ConfigDigest(t, img))
	}
	mf, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
	if err != nil || len(mf) != 1 || len(mf[0].RepoTags) != 1 || mf[0].RepoTags[0] != "docker.io/berth/imported:docker" {
		t.Errorf("manifest.json: %+v %v", mf, err)
	}
}

func TestLeaks(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk("content/ingest")
	mk("content/blobs/sha256")
	mk("snapshots/1/fs")
	mk("snapshots/2/fs")
	good := []byte("{}")
	if err := os.WriteFile(filepath.Join(root, BlobsDir, fmt.Sprintf("%x", sha256.Sum256(good))), good, 0o644); err != nil {
		t.Fatal(err)
	}
	if l := Leaks(root, WantSnapshots(2)); len(l) != 0 {
		t.Fatalf("clean root reported %v", l)
	}
	if l := Leaks(root, WantSnapshots(1)); len(l) != 1 || !strings.Contains(l[0], "2 snapshot folders") {
		t.Errorf("count mismatch reported %v", l)
	}
	mk("snapshots/tmp-123/fs")
	mk("snapshots/3")
	os.WriteFile(filepath.Join(root, IngestDir, "abc"), []byte("half"), 0o644)
	os.WriteFile(filepath.Join(root, BlobsDir, strings.Repeat("0", 64)), []byte("x"), 0o644)
	l := Leaks(root)
	want := []string{"in-progress download", "in-progress unpack", "without fs/", "holds content"}
	if len(l) != len(want) {
		t.Fatalf("leaks %q, want %d", l, len(want))
	}
	for _, w := range want {
		if !strings.Contains(strings.Join(l, "\n"), w) {
			t.Errorf("no leak mentions %q: %q", w, l)
		}
	}
	if got := FindInSnapshots(t, root, "."); len(got) != 2 {
		t.Errorf("FindInSnapshots: %v", got)
	}
	if l := Leaks(filepath.Join(root, "nonexistent")); len(l) != 0 {
		t.Errorf("a fresh root reported %v", l)
	}
}

func TestRegistryTOML(t *testing.T) {
	got := RegistryTOML(map[string]HostConfig{
		"docker.io":      {Mirrors: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}},
		"127.0.0.1:5000": {PlainHTTP: true, SkipVerify: true, CAFile: "/ca.pem"},
	})
	want := `[registry."127.0.0.1:5000"]
plain_http = true
ca_file = "/ca.pem"
skip_verify = true
[registry."docker.io"]
mirrors = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestRequireEnvSkips(t *testing.T) {
	t.Setenv("BERTH_HARNESS_UNSET", "")
	ran := false
	t.Run("inner", func(t *testing.T) {
		RequireEnv(t, "BERTH_HARNESS_UNSET")
		ran = true
	})
	if ran {
		t.Error("RequireEnv did not skip")
	}
}
