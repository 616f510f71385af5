package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
)

// TestMakeLogFolder: the folders of a log path are made beneath the pod log
// root as deep as asked; a symlink or a file on the way, the pod's own
// folder included, is refused naming the log, and nothing is made where it
// leads (#34, finding 9).
func TestMakeLogFolder(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	fine := filepath.Join(root, "ns_fine_uid")
	if err := makeLogFolder(fine, filepath.Join(fine, "app/deeper/0.log")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(fine, "app/deeper")); err != nil || !fi.IsDir() {
		t.Errorf("the log's folder: %v, %v; want a folder", fi, err)
	}

	swapped := filepath.Join(root, "ns_swapped_uid")
	planted := filepath.Join(root, "ns_planted_uid")
	for _, err := range []error{
		os.Symlink(outside, swapped),
		os.MkdirAll(planted, 0o755),
		os.Symlink(outside, filepath.Join(planted, "link")),
		os.WriteFile(filepath.Join(planted, "file"), nil, 0o644),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ dir, log, why string }{
		{swapped, "app/0.log", "symlink"},
		{planted, "link/sub/0.log", "symlink"},
		{planted, "file/0.log", "not a folder"},
	} {
		log := filepath.Join(c.dir, c.log)
		err := makeLogFolder(c.dir, log)
		if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), log) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("makeLogFolder(%s) = %v, want a failed precondition naming the log and %q", log, err, c.why)
		}
	}
	if left, _ := os.ReadDir(outside); len(left) > 0 {
		t.Errorf("made outside the log root: %v", left)
	}
}
