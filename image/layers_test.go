package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// manyLayers is more layers than a pull unpacks at once, so that layers
// wait for slots, and later layers may commit before earlier ones.
const manyLayers = 3*parallelLayers + 1

// stackedLayers are manyLayers layers in which each layer i writes
// "layer/i" and "top" (so the top layer's wins), deletes the file of the
// layer below with a whiteout, and replaces the directory "dir" with an
// opaque one holding only "dir/i".
func stackedLayers(t *testing.T) []v1.Layer {
	var layers []v1.Layer
	for i := range manyLayers {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		add := func(name string, typ byte, content string) {
			hdr := &tar.Header{Name: name, Typeflag: typ, Mode: 0o644, Size: int64(len(content))}
			if typ == tar.TypeDir {
				hdr.Mode, hdr.Size = 0o755, 0
			}
			if err := tw.WriteHeader(hdr); err != nil {
				t.Fatal(err)
			}
			io.WriteString(tw, content)
		}
		add("layer/", tar.TypeDir, "")
		add(fmt.Sprintf("layer/%d", i), tar.TypeReg, strings.Repeat(fmt.Sprint(i), 64<<10))
		if i > 0 {
			add(fmt.Sprintf("layer/.wh.%d", i-1), tar.TypeReg, "")
			add("dir/.wh..wh..opq", tar.TypeReg, "")
		}
		add("dir/", tar.TypeDir, "")
		add(fmt.Sprintf("dir/%d", i), tar.TypeReg, "x")
		add("top", tar.TypeReg, fmt.Sprint(i))
		tw.Close()
		b := buf.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	return layers
}

func pushLayers(t *testing.T, host, repo string, layers []v1.Layer) v1.Image {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestPullManyLayersStackInOrder: layers unpacked several at a time, and
// committed in whatever order they finish, stack as the image says: the
// overlay of the image's snapshots shows the top layer's files, with the
// whiteouts and opaque directories of each layer applied to the ones below.
func TestPullManyLayersStackInOrder(t *testing.T) {
	s, _ := newTestService(t)
	reg := httptest.NewServer(ggcrregistry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushLayers(t, host, "stack:v1", stackedLayers(t))

	img, err := s.Pull(context.Background(), host+"/stack:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.Lease("ctr", img)
	if err != nil || len(dirs) != manyLayers {
		t.Fatalf("Lease = %d dirs, %v; want %d", len(dirs), err, manyLayers)
	}
	slices.Reverse(dirs) // overlayfs lists the top layer first
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(dirs, ":")); err != nil {
		t.Fatalf("mount the image's layers: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)

	top := fmt.Sprint(manyLayers - 1)
	for dir, want := range map[string][]string{"layer": {top}, "dir": {top}} {
		ents, err := os.ReadDir(filepath.Join(mnt, dir))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s/ holds %v, want %v (each layer's whiteout and opaque directory hide the ones below)", dir, got, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "top")); err != nil || string(b) != top {
		t.Errorf("top = %q, %v; want the top layer's %q", b, err, top)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "layer", top)); err != nil || string(b) != strings.Repeat(top, 64<<10) {
		t.Errorf("layer/%s: %d bytes, %v", top, len(b), err)
	}
}

// TestPullCorruptMiddleLayerLeavesNothing: a layer in the middle of the
// image that fails its digest fails the pull, while the layers around it
// unpack and commit; the pull then leaves no snapshot, unpack folder, blob
// or download of that layer behind.
func TestPullCorruptMiddleLayerLeavesNothing(t *testing.T) {
	s, root := newTestService(t)
	layers := stackedLayers(t)
	bad, err := layers[manyLayers/2].Digest()
	if err != nil {
		t.Fatal(err)
	}
	inner := ggcrregistry.New()
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+bad.String()) {
			w = &flipByte{ResponseWriter: w, at: 100}
		}
		inner.ServeHTTP(w, r)
	}))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushLayers(t, host, "stack:v1", layers)

	_, err = s.Pull(context.Background(), host+"/stack:v1", nil)
	if err == nil {
		t.Fatal("Pull with a corrupt layer succeeded")
	}
	t.Logf("Pull: %v", err)
	waitCollected(t, s, root, 0, 0)
	partial := filepath.Join(root, "content", "ingest", "resumable", "sha256-"+bad.Hex)
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Errorf("the corrupt layer's download was kept: %v", err)
	}
}

// flipByte changes the byte at offset at of a response body.
type flipByte struct {
	http.ResponseWriter
	at, off int
}

func (f *flipByte) Write(p []byte) (int, error) {
	if i := f.at - f.off; i >= 0 && i < len(p) {
		p = slices.Clone(p)
		p[i] ^= 0xff
	}
	f.off += len(p)
	return f.ResponseWriter.Write(p)
}

// TestPullCorruptLayerIsTheBlobsFailure: a layer blob whose bytes are not
// what its digest names (an uncompressed layer, so that the tar reads on
// to the digest check) fails the pull with a failure of the blob
// (blobFailure): pulls waiting on a shared unpack of it take that failure
// rather than each fetch the blob again.
func TestPullCorruptLayerIsTheBlobsFailure(t *testing.T) {
	s, _ := newTestService(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := strings.Repeat("a", 64<<10)
	if err := tw.WriteHeader(&tar.Header{Name: "file", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tw, content)
	tw.Close()
	layer := static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)
	d, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	inner := ggcrregistry.New()
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
			w = &flipByte{ResponseWriter: w, at: 4096} // in the file's content
		}
		inner.ServeHTTP(w, r)
	}))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushLayers(t, host, "corrupt:v1", []v1.Layer{layer})

	_, err = s.Pull(context.Background(), host+"/corrupt:v1", nil)
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("Pull of a corrupt layer ended with %v, want its digest mismatch", err)
	}
	if !blobFailure(err) {
		t.Errorf("Pull of a corrupt layer: %v is not a failure of the blob: waiters would fetch it again", err)
	}
}
