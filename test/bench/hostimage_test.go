package bench

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/test/harness"
)

// hostTreeSources are the host folders the realistic image copies, each up
// to half of its bytes: shared libraries and text (documentation, locales,
// scripts), what the layers of real images are mostly made of.
var hostTreeSources = []string{"/usr/lib/x86_64-linux-gnu", "/usr/share"}

// maxHostFile leaves out the few big files (a real image has some, but the
// point of this image is many small ones).
const maxHostFile = 4 << 20

// hostTreeLayers makes n layers of about total bytes of the host's files
// (regular files and symbolic links, with their modes), taken in the order
// of their names, so the same host gives the same layers every run. Each
// layer holds a run of consecutive files, with directory entries for the
// folders it writes into.
func hostTreeLayers(t testing.TB, n int, total int64) [][]harness.File {
	t.Helper()
	var files []harness.File
	var size int64
	for _, src := range hostTreeSources {
		got, n := hostFiles(t, src, total/int64(len(hostTreeSources)))
		files = append(files, got...)
		size += n
	}
	if size < total/2 {
		t.Fatalf("the host's %v hold %d bytes of files under %d bytes, too few for the realistic image", hostTreeSources, size, maxHostFile)
	}
	layers := make([][]harness.File, 0, n)
	perLayer := size/int64(n) + 1
	var cur []harness.File
	var curBytes int64
	for _, f := range files {
		cur = append(cur, f)
		curBytes += int64(len(f.Content))
		if curBytes >= perLayer && len(layers) < n-1 {
			layers = append(layers, withDirs(cur))
			cur, curBytes = nil, 0
		}
	}
	return append(layers, withDirs(cur))
}

// hostFiles reads the files below root, in lexical order, until max bytes.
func hostFiles(t testing.TB, root string, max int64) ([]harness.File, int64) {
	var out []harness.File
	var size int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: left out
		}
		if size >= max {
			return fs.SkipAll
		}
		rel := strings.TrimPrefix(p, "/")
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err == nil {
				out = append(out, harness.Symlink(rel, target))
			}
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil || info.Size() > maxHostFile {
				return nil
			}
			content, err := os.ReadFile(p)
			if err != nil || compressed(content) {
				return nil
			}
			out = append(out, harness.File{Path: rel, Content: content, Mode: int64(info.Mode().Perm())})
			size += int64(len(content))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", root, err)
	}
	return out, size
}

// compressed says whether content starts like a gzip, xz, bzip2 or zstd
// stream or a PNG: Debian compresses its documentation and manual pages,
// which images built for size leave out.
func compressed(content []byte) bool {
	for _, magic := range []string{"\x1f\x8b", "\xfd7zXZ", "BZh", "\x28\xb5\x2f\xfd", "\x89PNG"} {
		if strings.HasPrefix(string(content), magic) {
			return true
		}
	}
	return false
}

// withDirs puts a directory entry (0755) before the first file of each
// folder, parents first, as image builders write them.
func withDirs(files []harness.File) []harness.File {
	seen := map[string]bool{".": true}
	out := make([]harness.File, 0, len(files)+len(files)/8)
	for _, f := range files {
		var dirs []string
		for d := path.Dir(f.Path); !seen[d]; d = path.Dir(d) {
			seen[d] = true
			dirs = append(dirs, d)
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			out = append(out, harness.Dir(dirs[i], 0o755))
		}
		out = append(out, f)
	}
	return out
}
