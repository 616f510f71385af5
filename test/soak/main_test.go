// Package soak churns one berthd for a long time and checks that nothing it
// holds grows: thousands of pod create/start/stop/remove cycles a few at a
// time, tens of thousands of ExecSync calls, and hundreds of streaming execs
// and attaches into long-lived pods, with containers that exit, crash and
// get OOM-killed along the way. Leaks of that kind show only under churn
// (shims left behind under high pod churn, containerd#12344; a per-exec
// memory leak in the shim, containerd/ttrpc#241; a goroutine leak in
// Attach, GHSA-m6hq-p25p-ffr2).
//
// It runs only with BERTH_SOAK=1 as root. `make soak` runs the long form
// (the defaults below); `make test` runs a short form (BERTH_SOAK_* sizes
// set by the Makefile's test-soak). Both print the figures; the test fails
// on a count that does not return to its baseline or on growth beyond the
// bounds in bounds.
package soak

import (
	"os"
	"strconv"
	"testing"

	"github.com/berth-runtime/berth/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m, "BERTH_SOAK") }

// sizes is how much work one run does.
type sizes struct {
	cycles   int // pod create/start/stop/remove cycles
	inFlight int // cycles running at once
	execSync int // ExecSync calls into the long-lived pod
	execs    int // streaming execs into the long-lived pod
	attaches int // streaming attaches to the long-lived pod's ticker
	rounds   int // sample points: the work is done in this many equal rounds
}

// sizesFromEnv reads BERTH_SOAK_CYCLES, _IN_FLIGHT, _EXECSYNC, _EXECS,
// _ATTACHES and _ROUNDS; the defaults are the long form issue #21 asks for.
func sizesFromEnv(t *testing.T) sizes {
	t.Helper()
	s := sizes{
		cycles:   envInt(t, "BERTH_SOAK_CYCLES", 2000),
		inFlight: envInt(t, "BERTH_SOAK_IN_FLIGHT", 5),
		execSync: envInt(t, "BERTH_SOAK_EXECSYNC", 20000),
		execs:    envInt(t, "BERTH_SOAK_EXECS", 500),
		attaches: envInt(t, "BERTH_SOAK_ATTACHES", 500),
		rounds:   envInt(t, "BERTH_SOAK_ROUNDS", 20),
	}
	if s.rounds < 3 || s.cycles < s.rounds || s.inFlight < 1 {
		t.Fatalf("BERTH_SOAK_*: %+v: need at least 3 rounds, a cycle per round and one in flight", s)
	}
	return s
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}
