package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri"
	"github.com/berth-runtime/berth/image"
)

type fakeImages struct {
	runtimeapi.UnimplementedImageServiceServer
	imgs []*runtimeapi.Image
}

func (f fakeImages) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{Images: f.imgs}, nil
}

type fakeImporter struct{ got *string }

func (f fakeImporter) Import(_ context.Context, path string) ([]*image.Image, error) {
	*f.got = path
	return []*image.Image{{ID: "sha256:" + strings.Repeat("a", 64), RepoTags: []string{"example.com/app:1"}}}, nil
}

// serve runs a berth socket with fake services and returns its path.
func serve(t *testing.T, imgs []*runtimeapi.Image, imported *string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "berthctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "b.sock")
	s := cri.NewServer(cri.ServerOptions{
		Socket:    sock,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Images:    fakeImages{imgs: imgs},
		Extension: cri.NewExtensionServer(fakeImporter{got: imported}),
	})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Shutdown(time.Second) })
	return sock
}

func TestImageLs(t *testing.T) {
	sock := serve(t, []*runtimeapi.Image{
		{Id: "sha256:0123456789abcdef0123", RepoTags: []string{"docker.io/library/busybox:1.36", "b:x"}, Size: 4_380_000},
		{Id: "sha256:fedcba9876543210", RepoDigests: []string{"r.example/app@sha256:99"}, Size: 512},
		{Id: "sha256:1111111111111111", Size: 2_500_000_000},
	}, nil)
	var out bytes.Buffer
	if err := run([]string{"--socket", sock, "image", "ls"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := `IMAGE                            IMAGE ID        SIZE
docker.io/library/busybox:1.36   0123456789abc   4.38MB
r.example/app@sha256:99          fedcba9876543   512B
<none>                           1111111111111   2.5GB
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestImageImport(t *testing.T) {
	var got string
	sock := serve(t, nil, &got)
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("app.tar", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"-socket=" + sock, "image", "import", "app.tar"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "app.tar"); got != want {
		t.Errorf("berthd got path %q, want absolute %q", got, want)
	}
	if !strings.Contains(out.String(), "sha256:aaaa") || !strings.Contains(out.String(), "example.com/app:1") {
		t.Errorf("output %q lacks the ID and tag", out.String())
	}
}

func TestErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"image"},
		{"image", "rm", "x"},
		{"image", "import"},
		{"--socket", "/nonexistent/berth.sock", "image", "ls"},
	} {
		if err := run(args, io.Discard, io.Discard); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
}

func TestHumanSize(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 999: "999B", 1000: "1kB", 1234: "1.23kB", 999_600: "1MB", 7_380_000: "7.38MB"} {
		if got := humanSize(n); got != want {
			t.Errorf("humanSize(%d) = %q, want %q", n, got, want)
		}
	}
}
