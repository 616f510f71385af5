package server

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		ws        unix.WaitStatus
		code, sig int
	}{
		{0, 0, 0},
		{3 << 8, 3, 0},               // exited 3
		{unix.WaitStatus(9), 137, 9}, // killed by SIGKILL
		{unix.WaitStatus(15), 143, 15},
	} {
		if code, sig := (exit{status: tc.ws}).code(); code != tc.code || sig != tc.sig {
			t.Errorf("status %#x: got %d/%d, want %d/%d", tc.ws, code, sig, tc.code, tc.sig)
		}
	}
}

func TestRlimits(t *testing.T) {
	got, err := rlimits([]specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 10, Soft: 5}})
	if err != nil || len(got) != 1 || got[0] != (configs.Rlimit{Type: unix.RLIMIT_NOFILE, Hard: 10, Soft: 5}) {
		t.Fatalf("got %v %v", got, err)
	}
	if _, err := rlimits([]specs.POSIXRlimit{{Type: "RLIMIT_BOGUS"}}); err == nil {
		t.Fatal("unknown rlimit accepted")
	}
}

// TestInitLogLevel: a container's init and an exec's are told the shim's
// log level (info), so nsexec does not write its debug lines for the shim to drop.
func TestInitLogLevel(t *testing.T) {
	p, err := lcProcess(&specs.Process{Args: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	e := execProcess(&ctr{proc: p}, &shim.ExecRequest{Args: []string{"true"}})
	want := strconv.Itoa(int(logrus.InfoLevel))
	if p.LogLevel != want || e.LogLevel != want {
		t.Fatalf("init log level %q, exec %q, want %q", p.LogLevel, e.LogLevel, want)
	}
}

func TestFitCapabilities(t *testing.T) {
	if len(boundingSet()) == 0 {
		t.Skip("no capability bounding set")
	}
	have := []string{}
	for c := range boundingSet() {
		have = append(have, c)
		break
	}
	cfg := &configs.Config{Capabilities: &configs.Capabilities{
		Bounding: append(slices.Clone(have), "CAP_NOT_REAL"), Effective: []string{"CAP_NOT_REAL"},
	}}
	fitCapabilities("t", cfg)
	if !slices.Equal(cfg.Capabilities.Bounding, have) || len(cfg.Capabilities.Effective) != 0 {
		t.Fatalf("got %+v", cfg.Capabilities)
	}
}

func TestOOMScoreAdjRaiseKept(t *testing.T) {
	_, cur := canLowerOOM()
	v := cur + 1
	cfg := &configs.Config{OomScoreAdj: &v}
	fitOOMScoreAdj("t", cfg)
	if cfg.OomScoreAdj == nil || *cfg.OomScoreAdj != v {
		t.Fatal("a raise of oom_score_adj was dropped")
	}
}

func TestDescendants(t *testing.T) {
	if pp, ok := parentOf(os.Getpid()); !ok || pp != os.Getppid() {
		t.Fatalf("parentOf(self) = %d %v", pp, ok)
	}
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var kids []procLink
	for range 200 {
		if kids = descendants(os.Getpid()); len(kids) >= 2 {
			break
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 5e6}, nil)
	}
	if len(kids) != 2 || kids[0].pid != cmd.Process.Pid || kids[1].ppid != cmd.Process.Pid {
		t.Fatalf("descendants: %+v (sh is %d)", kids, cmd.Process.Pid)
	}
	unix.Kill(kids[1].pid, unix.SIGKILL)
}

// TestSpecShape: every name in the warm-up's spec shape is a field of the
// OCI spec (a misspelt one would be skipped and warm nothing).
func TestSpecShape(t *testing.T) {
	d := json.NewDecoder(strings.NewReader(specShape))
	d.DisallowUnknownFields()
	var s specs.Spec
	if err := d.Decode(&s); err != nil {
		t.Fatal(err)
	}
	if s.Process == nil || s.Process.Capabilities == nil || s.Root == nil || s.Linux == nil || s.Linux.Resources == nil ||
		s.Linux.Seccomp == nil || len(s.Linux.Seccomp.Syscalls) != 1 || len(s.Linux.Seccomp.Syscalls[0].Args) != 1 {
		t.Fatalf("decoded %+v", s)
	}
}
