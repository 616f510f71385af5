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

func TestDrawCharts(t *testing.T) {
	var b bytes.Buffer
	drawCharts(&b, []startChart{
		{title: "pod ns/web 0123456789abc", steps: []step{{"namespaces", 2 * time.Millisecond}, {"network", 40 * time.Millisecond}}},
		{title: "container app 9876543210fed", steps: []step{{"start", 10 * time.Millisecond}, {"create", time.Microsecond}}},
	})
	lines := strings.Split(b.String(), "\n")
	want := []string{
		"pod ns/web 0123456789abc  total 42.0 ms",
		"  namespaces ██                                            2.0 ms",
		"  network    ████████████████████████████████████████     40.0 ms",
		"",
		"container app 9876543210fed  total 10.0 ms",
		"  start      ██████████                                   10.0 ms",
		"  create     ▏                                             0.0 ms",
	}
	for i, w := range want {
		if i >= len(lines) || lines[i] != w {
			t.Errorf("line %d:\n got %q\nwant %q\nall:\n%s", i, lines[min(i, len(lines)-1)], w, b.String())
		}
	}
}

func TestConfigCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("log_level = \"loud\"\n[metrics]\naddress = \"127.0.0.1:9338\"\nbogus = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := run([]string{"config", "check", path}, &out, io.Discard)
	if err == nil || !strings.Contains(out.String(), path+":1: log_level = \"loud\"") || !strings.Contains(out.String(), path+":4: unknown key \"metrics.bogus\"") {
		t.Errorf("config check = %v, output:\n%s", err, out.String())
	}
	if err := os.WriteFile(path, []byte("[metrics]\naddress = \"127.0.0.1:9338\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run([]string{"config", "check", path}, &out, io.Discard); err != nil || out.String() != path+": ok\n" {
		t.Errorf("config check of a good file = %v, %q", err, out.String())
	}
}
