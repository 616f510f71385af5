package kubeenv

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Work is the folder everything of a run lives below.
type Work struct {
	Dir     string
	logsVar string // names a folder to keep the logs of every run in
}

// NewWork makes the run's folder: prefix keeps it short, as unix socket
// paths below it must stay under 108 bytes. logsVar is the variable naming
// a folder to keep the daemons' logs in (CI artifacts); without it they are
// kept, in /tmp/<logsVar in lower case>-TIME, only when the test failed.
// With logsVar "" Remove keeps nothing: the caller keeps the logs it wants.
func NewWork(t *testing.T, prefix, logsVar string) *Work {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	// Traversable, as /run is for berthd's default state folder: the init of
	// a hostUsers: false container reaches its bundle through it.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return &Work{Dir: dir, logsVar: logsVar}
}

func (w *Work) Path(elem ...string) string {
	return filepath.Join(append([]string{w.Dir}, elem...)...)
}

// Remove unmounts what is still mounted below the folder (a leak, unless
// it is one of selfMounts: folders that are bind mounts of themselves by
// design), keeps the logs (*.log of the folder) as NewWork says, and
// removes the folder.
func (w *Work) Remove(t *testing.T, selfMounts ...string) {
	for _, m := range MountsUnder(w.Dir) {
		if !slices.Contains(selfMounts, m) {
			t.Errorf("teardown: %s is still mounted (unmounted now)", m)
		}
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			t.Errorf("teardown: unmount %s: %v", m, err)
		}
	}
	keep := ""
	if w.logsVar != "" {
		keep = os.Getenv(w.logsVar)
		if keep == "" && t.Failed() {
			keep = filepath.Join(os.TempDir(), strings.ToLower(strings.ReplaceAll(w.logsVar, "_", "-"))+"-"+time.Now().Format("20060102-150405"))
		}
	}
	if keep != "" && os.MkdirAll(keep, 0o755) == nil {
		logs, _ := filepath.Glob(w.Path("*.log"))
		for _, f := range logs {
			if b, err := os.ReadFile(f); err == nil {
				_ = os.WriteFile(filepath.Join(keep, filepath.Base(f)), b, 0o644)
			}
		}
		t.Logf("full logs kept in %s", keep)
	}
	if t.Failed() {
		for _, msg := range recordedTimeouts() {
			t.Logf("gave up waiting: %s", msg)
		}
	}
	if err := os.RemoveAll(w.Dir); err != nil {
		t.Errorf("teardown: remove %s: %v", w.Dir, err)
	}
}

// MountsUnder lists the mount points of dir and below, deepest first,
// those in except left out.
func MountsUnder(dir string, except ...string) []string {
	return MountsUnderIn("/proc/self/mountinfo", dir, except...)
}

// MountsUnderIn is MountsUnder as the mountinfo file (/proc/PID/mountinfo)
// of a process in another mount namespace shows them.
func MountsUnderIn(mountinfo, dir string, except ...string) []string {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mp := unescapeMount(fields[4])
			if (mp == dir || strings.HasPrefix(mp, dir+"/")) && !slices.Contains(except, mp) {
				out = append(out, mp)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return slices.Compact(out)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
