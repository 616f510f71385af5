package harness

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BusyboxPath is where Debian's busybox-static installs the binary.
const BusyboxPath = "/bin/busybox"

// BusyboxApplets are linked to busybox in the test images' /bin.
var BusyboxApplets = []string{"sh", "ls", "cat", "echo", "sleep", "id", "env", "true", "false",
	"mkdir", "rm", "touch", "stat", "test", "grep", "ps", "hostname", "wc", "head", "tail", "kill", "top"}

// FixedTime is the modification time of every test file that does not set one,
// so that the same files always make the same layer digest.
var FixedTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// File is one entry of a test layer.
type File struct {
	// Path inside the image, relative ("etc/passwd"); directories need no trailing slash.
	Path string
	// Type is a tar type flag; 0 means tar.TypeReg.
	Type byte
	// Content of a regular file.
	Content []byte
	// Mode holds the permission bits plus setuid/setgid/sticky (04755);
	// 0 means 0644 for files, 0755 for directories, 0777 for symlinks.
	Mode int64
	// UID and GID own the entry.
	UID, GID int
	// Link is the target of a symlink or hard link (tar.TypeSymlink, tar.TypeLink).
	Link string
	// Xattrs are stored as PAX SCHILY.xattr records ("user.berth": "yes").
	Xattrs map[string]string
	// ModTime; zero means FixedTime.
	ModTime time.Time
	// Devmajor and Devminor of a device node (tar.TypeChar, tar.TypeBlock).
	Devmajor, Devminor int64
}

// Dir is a directory entry.
func Dir(p string, mode int64) File { return File{Path: p, Type: tar.TypeDir, Mode: mode} }

// Reg is a regular file with the given content and mode.
func Reg(p, content string, mode int64) File {
	return File{Path: p, Content: []byte(content), Mode: mode}
}

// Symlink is a symbolic link p → target.
func Symlink(p, target string) File { return File{Path: p, Type: tar.TypeSymlink, Link: target} }

// Hardlink is a hard link p to the earlier entry target.
func Hardlink(p, target string) File { return File{Path: p, Type: tar.TypeLink, Link: target} }

// Whiteout deletes p from the layers below: an OCI ".wh.NAME" entry.
func Whiteout(p string) File {
	dir, base := path.Split(p)
	return File{Path: dir + ".wh." + base}
}

// OpaqueWhiteout hides everything the layers below have in dir: "DIR/.wh..wh..opq".
func OpaqueWhiteout(dir string) File {
	return File{Path: path.Join(dir, ".wh..wh..opq")}
}

// TarBytes writes files, in order, into an uncompressed tar stream.
func TarBytes(t testing.TB, files []File) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{
			Name:     f.Path,
			Typeflag: f.Type,
			Mode:     f.Mode,
			Uid:      f.UID,
			Gid:      f.GID,
			Linkname: f.Link,
			ModTime:  f.ModTime,
			Devmajor: f.Devmajor,
			Devminor: f.Devminor,
			Format:   tar.FormatPAX,
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.ModTime.IsZero() {
			hdr.ModTime = FixedTime
		}
		switch hdr.Typeflag {
		case tar.TypeReg:
			hdr.Size = int64(len(f.Content))
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
		case tar.TypeDir:
			hdr.Name = strings.TrimSuffix(hdr.Name, "/") + "/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
		case tar.TypeSymlink:
			if hdr.Mode == 0 {
				hdr.Mode = 0o777
			}
		}
		if len(f.Xattrs) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range f.Xattrs {
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %s: %v", f.Path, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Content); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var busybox struct {
	once    sync.Once
	content []byte
	err     error
}

// BusyboxBinary is the content of Debian's busybox-static /bin/busybox; the test
// fails when it is missing (apt-get install busybox-static).
func BusyboxBinary(t testing.TB) []byte {
	t.Helper()
	busybox.once.Do(func() { busybox.content, busybox.err = os.ReadFile(BusyboxPath) })
	if busybox.err != nil {
		t.Fatalf("test images need Debian's busybox-static (apt-get install -y busybox-static): %v", busybox.err)
	}
	return busybox.content
}

// Passwd is the test images' /etc/passwd.
const Passwd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
berth:x:1002:1002:berth test user:/home/berth:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
`

// Group is the test images' /etc/group.
const Group = `root:x:0:
daemon:x:1:
www-data:x:33:
berth:x:1002:
extra:x:1004:berth
nogroup:x:65534:
`

// BusyboxFiles are the files of the busybox base layer: /bin/busybox with its
// applet symlinks, /etc/passwd, /etc/group, /tmp and /root.
func BusyboxFiles(t testing.TB) []File {
	t.Helper()
	files := []File{
		Dir("bin", 0o755),
		{Path: "bin/busybox", Content: BusyboxBinary(t), Mode: 0o755},
	}
	for _, a := range BusyboxApplets {
		files = append(files, Symlink("bin/"+a, "busybox"))
	}
	return append(files,
		Dir("etc", 0o755),
		Reg("etc/passwd", Passwd, 0o644),
		Reg("etc/group", Group, 0o644),
		Dir("root", 0o700),
		Dir("tmp", 0o1777),
	)
}

// Format selects the media types of a test image.
type Format int

const (
	// OCI media types (application/vnd.oci.image.*).
	OCI Format = iota
	// Docker media types (application/vnd.docker.distribution.manifest.v2+json, …).
	Docker
)

func (f Format) String() string {
	if f == Docker {
		return "docker"
	}
	return "oci"
}

// Compression of a test layer.
type Compression string

const (
	Gzip         Compression = "gzip" // the default
	Zstd         Compression = "zstd"
	Uncompressed Compression = "none"
)

func layerMediaType(t testing.TB, f Format, c Compression) types.MediaType {
	t.Helper()
	switch {
	case f == OCI && (c == Gzip || c == ""):
		return types.OCILayer
	case f == OCI && c == Zstd:
		return types.OCILayerZStd
	case f == OCI && c == Uncompressed:
		return types.OCIUncompressedLayer
	case f == Docker && (c == Gzip || c == ""):
		return types.DockerLayer
	case f == Docker && c == Uncompressed:
		return types.DockerUncompressedLayer
	}
	t.Fatalf("no media type for %s layers compressed with %s", f, c)
	return ""
}

// Layer makes a layer of files with the format's media type and compression.
func Layer(t testing.TB, files []File, f Format, c Compression) v1.Layer {
	t.Helper()
	return LayerFromTar(t, TarBytes(t, files), f, c)
}

// LayerFromTar makes a layer of an uncompressed tar stream.
func LayerFromTar(t testing.TB, tarball []byte, f Format, c Compression) v1.Layer {
	t.Helper()
	mt := layerMediaType(t, f, c)
	if c == Uncompressed {
		return newRawLayer(tarball, mt)
	}
	comp := compression.GZip
	if c == Zstd {
		comp = compression.ZStd
	}
	l, err := tarballLayer(tarball, comp, mt)
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	return l
}

func tarballLayer(b []byte, comp compression.Compression, mt types.MediaType) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompression(comp), tarball.WithMediaType(mt), tarball.WithCompressedCaching)
}

// rawLayer is an uncompressed layer: its digest is its diff ID.
type rawLayer struct {
	b  []byte
	h  v1.Hash
	mt types.MediaType
}

func newRawLayer(b []byte, mt types.MediaType) *rawLayer {
	sum := sha256.Sum256(b)
	return &rawLayer{b: b, h: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, mt: mt}
}

func (l *rawLayer) Digest() (v1.Hash, error)            { return l.h, nil }
func (l *rawLayer) DiffID() (v1.Hash, error)            { return l.h, nil }
func (l *rawLayer) Size() (int64, error)                { return int64(len(l.b)), nil }
func (l *rawLayer) MediaType() (types.MediaType, error) { return l.mt, nil }
func (l *rawLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.b)), nil
}
func (l *rawLayer) Uncompressed() (io.ReadCloser, error) { return l.Compressed() }

type layerKey struct {
	f Format
	c Compression
}

var busyboxLayers sync.Map // layerKey → v1.Layer

// BusyboxLayer is the base layer of BusyboxFiles, built once per format and compression.
func BusyboxLayer(t testing.TB, f Format, c Compression) v1.Layer {
	t.Helper()
	if c == "" {
		c = Gzip
	}
	k := layerKey{f, c}
	if l, ok := busyboxLayers.Load(k); ok {
		return l.(v1.Layer)
	}
	l, _ := busyboxLayers.LoadOrStore(k, Layer(t, BusyboxFiles(t), f, c))
	return l.(v1.Layer)
}

// Platform of a test image.
type Platform = v1.Platform

// Platforms of the test index; only AMD64 holds the real busybox image.
var (
	AMD64 = Platform{OS: "linux", Architecture: "amd64"}
	ARM64 = Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	ARMv7 = Platform{OS: "linux", Architecture: "arm", Variant: "v7"}
)

// ImageSpec describes a test image.
type ImageSpec struct {
	// Format selects OCI (default) or Docker media types.
	Format Format
	// Compression of every layer (the busybox base too); gzip by default.
	Compression Compression
	// Layers are added in order, each a list of files (whiteouts included).
	Layers [][]File
	// Config is the runtime config (Entrypoint, Cmd, Env, User, WorkingDir,
	// StopSignal, Labels…). When Cmd and Entrypoint are both empty Cmd is
	// ["/bin/sh"]; when Env is empty it holds a PATH.
	Config v1.Config
	// Platform defaults to linux/amd64.
	Platform *Platform
}

// DefaultPath is the PATH of the test images.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// NewImage builds an image of spec.Layers alone.
func NewImage(t testing.TB, spec ImageSpec) v1.Image {
	t.Helper()
	return buildImage(t, spec, nil)
}

// BusyboxImage builds an image of the busybox base layer plus spec.Layers.
func BusyboxImage(t testing.TB, spec ImageSpec) v1.Image {
	t.Helper()
	return buildImage(t, spec, BusyboxLayer(t, spec.Format, spec.Compression))
}

func buildImage(t testing.TB, spec ImageSpec, base v1.Layer) v1.Image {
	t.Helper()
	var img v1.Image = empty.Image
	if spec.Format == Docker {
		img = mutate.MediaType(img, types.DockerManifestSchema2)
		img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	} else {
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	}
	var layers []v1.Layer
	if base != nil {
		layers = append(layers, base)
	}
	for _, files := range spec.Layers {
		layers = append(layers, Layer(t, files, spec.Format, spec.Compression))
	}
	var err error
	if img, err = mutate.AppendLayers(img, layers...); err != nil {
		t.Fatalf("append layers: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	p := AMD64
	if spec.Platform != nil {
		p = *spec.Platform
	}
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: FixedTime}
	cf.Config = spec.Config
	if len(cf.Config.Cmd) == 0 && len(cf.Config.Entrypoint) == 0 {
		cf.Config.Cmd = []string{"/bin/sh"}
	}
	if len(cf.Config.Env) == 0 {
		cf.Config.Env = []string{DefaultPath}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Index builds a multi-platform index (an OCI index, or a Docker manifest list
// for the Docker format) whose entries are, in this order, linux/arm64,
// linux/arm/v7 and linux/amd64. Only amd64 is the given image; the others are
// small images of their own (an /etc/arch file) that a runtime on amd64 must
// not pick.
func Index(t testing.TB, f Format, amd64 v1.Image) v1.ImageIndex {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	if f == Docker {
		idx = mutate.IndexMediaType(idx, types.DockerManifestList)
	} else {
		idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	}
	var adds []mutate.IndexAddendum
	for _, p := range []Platform{ARM64, ARMv7} {
		img := NewImage(t, ImageSpec{Format: f, Platform: &p,
			Layers: [][]File{{Dir("etc", 0o755), Reg("etc/arch", p.String()+"\n", 0o644)}}})
		adds = append(adds, indexEntry(t, img, p))
	}
	adds = append(adds, indexEntry(t, amd64, AMD64))
	return mutate.AppendManifests(idx, adds...)
}

func indexEntry(t testing.TB, img v1.Image, p Platform) mutate.IndexAddendum {
	t.Helper()
	mt, err := img.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{MediaType: mt, Platform: &p}}
}

// PlatformImage returns idx's entry for platform p.
func PlatformImage(t testing.TB, idx v1.ImageIndex, p Platform) v1.Image {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == p.OS && d.Platform.Architecture == p.Architecture {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("index has no %s entry", p)
	return nil
}

func mustDigest(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// ManifestDigest is the digest of img's manifest, "sha256:…".
func ManifestDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	return mustDigest(t, img).String()
}

// ConfigDigest is img's config digest, "sha256:…": the image ID berth reports.
func ConfigDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// LayerDigests are the digests of img's layer blobs, bottom first.
func LayerDigests(t testing.TB, img v1.Image) []v1.Hash {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var ds []v1.Hash
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return ds
}

// ConfigHash is img's config digest as a v1.Hash (for Registry faults and counters).
func ConfigHash(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// BlobSize is the size of img's layer or config blob d.
func BlobSize(t testing.TB, img v1.Image, d v1.Hash) int64 {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.Digest == d {
		return m.Config.Size
	}
	for _, l := range m.Layers {
		if l.Digest == d {
			return l.Size
		}
	}
	t.Fatalf("image has no blob %s", d)
	return 0
}

// ChainIDs are the chain IDs of img's layers, bottom first: what berth keys its
// snapshots by.
func ChainIDs(t testing.TB, img v1.Image) []string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	chain := ""
	for _, diff := range cf.RootFS.DiffIDs {
		if chain == "" {
			chain = diff.String()
		} else {
			sum := sha256.Sum256([]byte(chain + " " + diff.String()))
			chain = "sha256:" + hex.EncodeToString(sum[:])
		}
		ids = append(ids, chain)
	}
	return ids
}

// DistinctChainIDs is the set of chain IDs across imgs, sorted.
func DistinctChainIDs(t testing.TB, imgs ...v1.Image) []string {
	t.Helper()
	set := map[string]bool{}
	for _, img := range imgs {
		for _, id := range ChainIDs(t, img) {
			set[id] = true
		}
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// RefNameAnnotations are the annotations an OCI layout entry carries to name
// its image: the OCI one and the one containerd's importer reads.
func RefNameAnnotations(ref string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.ref.name": ref,
		"io.containerd.image.name":          ref,
	}
}

// WriteOCILayout writes an OCI image layout into dir (created if needed) with one
// entry: img (a v1.Image or v1.ImageIndex) named ref ("docker.io/berth/imported:oci")
// through RefNameAnnotations.
func WriteOCILayout(t testing.TB, dir, ref string, img any) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatalf("oci layout %s: %v", dir, err)
	}
	opt := layout.WithAnnotations(RefNameAnnotations(ref))
	switch x := img.(type) {
	case v1.Image:
		err = p.AppendImage(x, opt)
	case v1.ImageIndex:
		err = p.AppendIndex(x, opt)
	default:
		t.Fatalf("WriteOCILayout: %T is neither an image nor an index", img)
	}
	if err != nil {
		t.Fatalf("oci layout %s: %v", dir, err)
	}
}

// WriteDockerSave writes img as a `docker save` tarball at file, tagged ref
// ("docker.io/berth/imported:docker") in its manifest.json RepoTags.
func WriteDockerSave(t testing.TB, file, ref string, img v1.Image) {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatalf("tag %q: %v", ref, err)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tarball.Write(tag, img, f); err != nil {
		t.Fatalf("docker save %s: %v", file, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// Describe is a one-line summary of img for test logs.
func Describe(t testing.TB, img v1.Image) string {
	t.Helper()
	mt, _ := img.MediaType()
	return fmt.Sprintf("%s manifest %s config %s layers %d", mt, ManifestDigest(t, img), ConfigDigest(t, img), len(LayerDigests(t, img)))
}
