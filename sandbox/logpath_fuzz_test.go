package sandbox

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
)

// FuzzLogPath: a log_directory and log_path that pass the checks name a
// file inside that directory, whatever the caller sent; what they refuse
// is an invalid argument.
func FuzzLogPath(f *testing.F) {
	f.Add("/var/log/pods/ns_name_uid", "app/0.log")
	f.Add("/var/log/pods/x", "../../../etc/shadow")
	f.Add("/var/log/pods/x/../../..", "etc/shadow")
	f.Add("var/log", "0.log")
	f.Add("/", "a/./b/../../c")
	f.Add("/logs", "/etc/passwd")
	f.Add("/logs//x/", "a\x00b")
	f.Fuzz(func(t *testing.T, dir, p string) {
		derr, perr := checkLogDirectory(dir), checkLogPath(p)
		for _, err := range []error{derr, perr} {
			if err != nil && !errors.Is(err, errkind.Invalid) {
				t.Fatalf("refused with %v, not an invalid argument", err)
			}
		}
		if derr != nil || perr != nil || dir == "" || p == "" {
			return
		}
		log := filepath.Join(dir, p) // as CreateContainer makes it
		d, l := elements(dir), elements(log)
		if !filepath.IsAbs(log) || len(l) <= len(d) || !slices.Equal(l[:len(d)], d) {
			t.Errorf("log_directory %q and log_path %q accepted, but the log %q is not inside the directory", dir, p, log)
		}
	})
}

// elements are the names a path goes through, as written: no "" or ".".
func elements(path string) []string {
	return slices.DeleteFunc(strings.Split(path, "/"), func(e string) bool { return e == "" || e == "." })
}
