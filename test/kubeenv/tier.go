package kubeenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// Require skips t unless the variable guard is "1", and fails it unless it
// runs as root: the tiers are privileged and run from make only.
func Require(t *testing.T, guard, target string) {
	t.Helper()
	if os.Getenv(guard) != "1" {
		t.Skipf("set %s=1 (root) to run this tier (make %s)", guard, target)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s=1 needs root (euid is %d)", guard, os.Geteuid())
	}
}

// RepoRoot is berth's repository: a tier's tests run in test/<tier>.
func RepoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// EnvOr is the variable name's value, or def when it is empty.
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// NeedFiles fails t, saying how to build them, when a path is missing.
func NeedFiles(t *testing.T, build string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v: build it with %s", err, build)
		}
	}
}

func Mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// WaitFor polls cond every half second until it holds or timeout passes,
// then fails t with what cond last said.
func WaitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("%s: not within %s: %s", what, timeout, detail)
			recordTimeout(t.Name() + ": " + msg)
			t.Fatal(msg)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Ctx is a context for one call of a test, 30 s at most.
func Ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// timeouts are the WaitFor calls of this test binary that gave up. The
// output CI shows of a failed run is its last lines, where a tier's
// teardown logs much else: Work.Remove repeats these there.
var timeouts struct {
	sync.Mutex
	msgs []string
}

func recordTimeout(msg string) {
	const most = 2000 // a list of leftovers can run to many kilobytes
	if len(msg) > most {
		msg = msg[:most] + "…"
	}
	timeouts.Lock()
	defer timeouts.Unlock()
	timeouts.msgs = append(timeouts.msgs, msg)
}

// recordedTimeouts is what recordTimeout kept, oldest first.
func recordedTimeouts() []string {
	timeouts.Lock()
	defer timeouts.Unlock()
	return slices.Clone(timeouts.msgs)
}
