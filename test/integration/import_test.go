package integration

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/berth-runtime/berth/test/harness"
)

func TestBerthctlImport(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	ociLayout := func(t *testing.T, path, ref string, img v1.Image) { harness.WriteOCILayout(t, path, ref, img) }
	dockerSave := func(t *testing.T, path, ref string, img v1.Image) { harness.WriteDockerSave(t, path, ref, img) }
	cases := []struct {
		name, ref string
		format    harness.Format
		comp      harness.Compression
		write     func(t *testing.T, path, ref string, img v1.Image)
	}{
		{"oci-layout", "docker.io/berth/imported:oci", harness.OCI, harness.Gzip, ociLayout},
		{"oci-layout-zstd", "docker.io/berth/imported:zstd", harness.OCI, harness.Zstd, ociLayout},
		{"oci-layout-with-index", "docker.io/berth/imported:multi", harness.OCI, harness.Gzip, func(t *testing.T, path, ref string, img v1.Image) {
			harness.WriteOCILayout(t, path, ref, harness.Index(t, harness.OCI, img))
		}},
		{"docker-save", "docker.io/berth/imported:docker", harness.Docker, harness.Gzip, dockerSave},
		// What `docker save` itself writes: uncompressed layer tars.
		{"docker-save-uncompressed-layers", "docker.io/berth/imported:plain", harness.Docker, harness.Uncompressed, dockerSave},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			harness.RequireIntegration(t)
			d := harness.StartDaemon(t, harness.Options{})
			img := harness.BusyboxImage(t, harness.ImageSpec{Format: c.format, Compression: c.comp,
				Layers: [][]harness.File{{harness.Reg("imported", c.name, 0o644)}}})
			id := harness.ConfigDigest(t, img)
			path := filepath.Join(t.TempDir(), c.name)
			c.write(t, path, c.ref, img)

			out, err := d.Berthctl("image", "import", path)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			st := mustStatus(t, d, c.ref)
			if st.Id != id {
				t.Errorf("imported image %s, want %s", st.Id, id)
			}
			if !slices.Contains(st.RepoTags, c.ref) {
				t.Errorf("imported image tags %q, want %q among them", st.RepoTags, c.ref)
			}
			found := false
			for _, img := range listImages(t, d, "") {
				found = found || img.Id == id
			}
			if !found {
				t.Errorf("ListImages lacks the imported %s", id)
			}
			ls, err := d.Berthctl("image", "ls")
			if err != nil {
				t.Fatalf("%v\n%s", err, ls)
			}
			if short := strings.TrimPrefix(id, "sha256:")[:12]; !strings.Contains(ls, c.ref) || !strings.Contains(ls, short) {
				t.Errorf("berthctl image ls lacks %s / %s:\n%s", c.ref, short, ls)
			}
			if got := snapshotFile(t, d.Root, "imported"); string(got) != c.name {
				t.Errorf("imported = %q, want %q", got, c.name)
			}
			if got := snapshotFile(t, d.Root, "bin/busybox"); !bytes.Equal(got, harness.BusyboxBinary(t)) {
				t.Error("imported bin/busybox differs")
			}
			if hits := harness.FindInSnapshots(t, d.Root, "etc/arch"); len(hits) != 0 {
				t.Errorf("a foreign platform was imported: %v", hits)
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}
