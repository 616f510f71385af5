package kubeenv

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"testing"
	"time"
)

// Entry is one entry of an image's layer: a folder (Dir), a symbolic link
// (to Link) or else a regular file holding Data.
type Entry struct {
	Name string // its path, relative to the root
	Mode int64
	Data []byte
	Link string
	Dir  bool
}

// Process is what an image's config says to run, as a Dockerfile's
// ENTRYPOINT, CMD, ENV, USER and WORKDIR say it.
type Process struct {
	Entrypoint, Cmd, Env []string
	User, WorkingDir     string
}

// PushImage stores a one-layer image of entries, running p, as repoTag
// and returns its reference and image ID.
func (r *Registry) PushImage(t *testing.T, repoTag string, entries []Entry, p Process) (ref, id string) {
	t.Helper()
	manifest, config, layer := oneLayerImage(t, entries, p)
	return r.push(repoTag, manifest, config, layer)
}

// PushLayer stores, as repoTag, an image whose one layer is the tar
// layerTar as it is given, with annotations on its manifest, and returns
// its reference and image ID: the image of a checkpoint archive is one,
// as CRI-O's users build it.
func (r *Registry) PushLayer(t *testing.T, repoTag string, layerTar []byte, annotations map[string]string) (ref, id string) {
	t.Helper()
	manifest, config, layer := layerImage(t, layerTar, Process{}, annotations)
	return r.push(repoTag, manifest, config, layer)
}

// oneLayerImage builds an OCI image (amd64) of one gzipped layer of
// entries, in their order, and returns its manifest, config and layer.
// Every entry has the same fixed time, so that the same entries give the
// same digests on every run.
func oneLayerImage(t *testing.T, entries []Entry, p Process) (manifest, config, layer blob) {
	t.Helper()
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: tar.TypeReg, Mode: e.Mode, ModTime: fixedTime, Format: tar.FormatPAX}
		switch {
		case e.Dir:
			h.Name, h.Typeflag = e.Name+"/", tar.TypeDir
		case e.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		default:
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return layerImage(t, tarBuf.Bytes(), p, nil)
}

// layerImage builds an OCI image (amd64) of one layer, layerTar gzipped,
// running p, with annotations on its manifest (none if nil), and returns
// its manifest, config and layer.
func layerImage(t *testing.T, layerTar []byte, p Process, annotations map[string]string) (manifest, config, layer blob) {
	t.Helper()
	diffID := digestOf(layerTar)

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(layerTar); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	layer = blob{"application/vnd.oci.image.layer.v1.tar+gzip", gz.Bytes()}

	process := map[string]any{"Env": p.Env, "Cmd": p.Cmd}
	if p.Entrypoint != nil {
		process["Entrypoint"] = p.Entrypoint
	}
	if p.User != "" {
		process["User"] = p.User
	}
	if p.WorkingDir != "" {
		process["WorkingDir"] = p.WorkingDir
	}
	cfg, err := json.Marshal(map[string]any{
		"created":      fixedTime.Format(time.RFC3339),
		"architecture": "amd64",
		"os":           "linux",
		"config":       process,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		t.Fatal(err)
	}
	config = blob{"application/vnd.oci.image.config.v1+json", cfg}

	fields := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": config.mediaType, "digest": digestOf(config.data), "size": len(config.data)},
		"layers":        []any{map[string]any{"mediaType": layer.mediaType, "digest": digestOf(layer.data), "size": len(layer.data)}},
	}
	if annotations != nil {
		fields["annotations"] = annotations
	}
	m, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return blob{"application/vnd.oci.image.manifest.v1+json", m}, config, layer
}
