package cri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/image"
)

// fakeImporter returns imgs, or err, and records the path it was given.
type fakeImporter struct {
	imgs []*image.Image
	err  error
	got  *string
}

func (f fakeImporter) Import(_ context.Context, path string) ([]*image.Image, error) {
	if f.got != nil {
		*f.got = path
	}
	return f.imgs, f.err
}

func extClient(t *testing.T, imp Importer) ExtensionClient {
	t.Helper()
	_, conn := startServer(t, ServerOptions{Extension: NewExtensionServer(imp)})
	return NewExtensionClient(conn)
}

func TestImport(t *testing.T) {
	tar := filepath.Join(t.TempDir(), "busybox.tar")
	if err := os.WriteFile(tar, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var got string
	img := &image.Image{
		ID:          "sha256:" + strings.Repeat("ab", 32),
		RepoTags:    []string{"docker.io/library/busybox:1.36"},
		RepoDigests: []string{"docker.io/library/busybox@sha256:" + strings.Repeat("cd", 32)},
		Size:        4 << 20,
		Pinned:      true,
	}
	img.Config.Config.User = "1000:1000"
	resp, err := extClient(t, fakeImporter{imgs: []*image.Image{img}, got: &got}).
		Import(context.Background(), &runtimeapi.ImageSpec{Image: tar})
	if err != nil {
		t.Fatal(err)
	}
	if got != tar {
		t.Errorf("importer got path %q, want %q", got, tar)
	}
	if len(resp.Images) != 1 {
		t.Fatalf("got %d images, want 1", len(resp.Images))
	}
	ci := resp.Images[0]
	if ci.Id != img.ID || ci.RepoTags[0] != img.RepoTags[0] || ci.RepoDigests[0] != img.RepoDigests[0] ||
		ci.Size != img.Size || !ci.Pinned || ci.GetUid().GetValue() != 1000 || ci.Username != "" {
		t.Errorf("converted image = %v", ci)
	}
}

func TestImportErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.tar")
	tests := []struct {
		name, path string
		err        error
		code       codes.Code
		msg        string
	}{
		{"relative", "busybox.tar", nil, codes.InvalidArgument, "absolute path"},
		{"empty", "", nil, codes.InvalidArgument, "absolute path"},
		{"missing", missing, nil, codes.InvalidArgument, missing + ": no such file"},
		{"bad reference", dir, fmt.Errorf("tag %q: %w", "A:B", image.ErrInvalidReference), codes.InvalidArgument, dir},
		{"vanished", dir, fmt.Errorf("%w: open %s/index.json: %w", image.ErrInvalidReference, dir, os.ErrNotExist), codes.InvalidArgument, dir + "/index.json"},
		{"disk full", dir, fmt.Errorf("write layer: %w", syscall.ENOSPC), codes.ResourceExhausted, "no space left"},
		{"broken", dir, errors.New("layer sha256:12: digest mismatch"), codes.Internal, "import " + dir + ": layer"},
		{"canceled", dir, context.Canceled, codes.Canceled, dir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := extClient(t, fakeImporter{err: tt.err}).Import(context.Background(), &runtimeapi.ImageSpec{Image: tt.path})
			st := status.Convert(err)
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
				t.Errorf("Import(%q) = %v %q, want %v containing %q", tt.path, st.Code(), st.Message(), tt.code, tt.msg)
			}
		})
	}
}

func TestToCRIImageUser(t *testing.T) {
	for user, want := range map[string]struct {
		uid  *int64
		name string
	}{
		"":          {nil, ""},
		"0":         {ptr(int64(0)), ""},
		"65534:100": {ptr(int64(65534)), ""},
		"nobody":    {nil, "nobody"},
		"www:www":   {nil, "www"},
		":100":      {nil, ""},
	} {
		img := &image.Image{ID: "sha256:x", Config: ocispec.Image{Config: ocispec.ImageConfig{User: user}}}
		ci := toCRIImage(img)
		if (ci.Uid == nil) != (want.uid == nil) || (ci.Uid != nil && ci.Uid.Value != *want.uid) || ci.Username != want.name {
			t.Errorf("user %q → uid %v name %q, want %v %q", user, ci.Uid, ci.Username, want.uid, want.name)
		}
	}
}

func ptr[T any](v T) *T { return &v }
