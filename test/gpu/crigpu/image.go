package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berth-runtime/berth/test/harness"
)

// imageRef names the check's image in its OCI layout and in berthd.
const imageRef = "berth.test/gpu-check:1"

// vecaddPath is cuda-vecadd's path in the image.
const vecaddPath = "/usr/local/bin/cuda-vecadd"

// applets are the busybox commands the check's scripts use.
var applets = []string{"sh", "ls", "cat", "echo", "sleep", "mknod", "grep", "test", "true", "env", "id", "stat", "head"}

// glibcExtras are the glibc libraries the driver libraries and nvidia-smi
// link against besides what cuda-vecadd needs (ldd names those): since
// glibc 2.34 most are stubs, but their sonames must be there.
var glibcExtras = []string{"libdl.so.2", "libpthread.so.0", "libm.so.6", "librt.so.1", "libgcc_s.so.1"}

// imageFile is one regular file, directory or symbolic link of the layer.
type imageFile struct {
	path    string // relative: "bin/busybox"
	mode    int64
	content []byte
	link    string // a symbolic link's target
	dir     bool
}

// buildImage writes an OCI layout to out holding one image, imageRef:
// Debian's busybox-static with its applets, cuda-vecadd (the binary at
// vecadd) and this host's glibc files it and the driver need, each at
// its host path. No registry is involved: berthctl imports the layout.
func buildImage(out, vecadd string) error {
	busybox, err := os.ReadFile(harness.BusyboxPath)
	if err != nil {
		return fmt.Errorf("the image needs Debian's busybox-static (apt-get install -y busybox-static): %w", err)
	}
	files := []imageFile{{path: "bin/busybox", mode: 0o755, content: busybox}}
	for _, a := range applets {
		files = append(files, imageFile{path: "bin/" + a, link: "busybox"})
	}
	prog, err := os.ReadFile(vecadd)
	if err != nil {
		return err
	}
	files = append(files, imageFile{path: strings.TrimPrefix(vecaddPath, "/"), mode: 0o755, content: prog})
	libs, err := glibcFiles(vecadd)
	if err != nil {
		return err
	}
	for _, p := range libs {
		b, err := os.ReadFile(p) // follows the soname links: the image holds the files
		if err != nil {
			return err
		}
		files = append(files, imageFile{path: strings.TrimPrefix(p, "/"), mode: 0o755, content: b})
	}
	files = append(files,
		imageFile{path: "etc/passwd", mode: 0o644, content: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		imageFile{path: "etc/group", mode: 0o644, content: []byte("root:x:0:\n")},
		imageFile{path: "tmp", mode: 0o1777, dir: true},
		imageFile{path: "root", mode: 0o700, dir: true},
	)
	layer, err := gzipLayer(withParents(files))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: harness.FixedTime}
	cf.Config = v1.Config{Env: []string{harness.DefaultPath}, Cmd: []string{"/bin/sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(harness.RefNameAnnotations(imageRef)))
}

// glibcFiles are the loader and libraries ldd names for prog, and
// glibcExtras from the folder of its libc.
func glibcFiles(prog string) ([]string, error) {
	out, err := exec.Command("ldd", prog).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", prog, err)
	}
	// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", the loader
	// as "/lib64/ld-linux-x86-64.so.2 (0x...)", the vDSO without a path.
	var paths []string
	libcDir := ""
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			paths = append(paths, f)
			if path.Base(f) == "libc.so.6" {
				libcDir = path.Dir(f)
			}
		}
	}
	if libcDir == "" {
		return nil, fmt.Errorf("ldd %s names no libc.so.6: build it dynamically linked against glibc", prog)
	}
	for _, name := range glibcExtras {
		p := path.Join(libcDir, name)
		if _, err := os.Stat(p); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// withParents puts a directory entry (0755) before each file whose folder
// has none yet.
func withParents(files []imageFile) []imageFile {
	seen := map[string]bool{".": true}
	for _, f := range files {
		if f.dir {
			seen[f.path] = true
		}
	}
	var out []imageFile
	for _, f := range files {
		var dirs []imageFile
		for d := path.Dir(f.path); !seen[d]; d = path.Dir(d) {
			seen[d] = true
			dirs = append([]imageFile{{path: d, mode: 0o755, dir: true}}, dirs...)
		}
		out = append(append(out, dirs...), f)
	}
	return out
}

// gzipLayer is a gzip-compressed OCI layer of files, in order.
func gzipLayer(files []imageFile) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Name: f.path, Mode: f.mode, ModTime: harness.FixedTime, Format: tar.FormatPAX}
		switch {
		case f.dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, f.path+"/"
		case f.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.link, 0o777
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.content))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}
