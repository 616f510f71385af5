package ops

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

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
	e := execProcess(p, &shim.ExecRequest{Args: []string{"true"}})
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

func TestCgroupFiles(t *testing.T) {
	procs, oom := cgroupFiles(map[string]string{"": "/sys/fs/cgroup/pod/c"})
	if procs != "/sys/fs/cgroup/pod/c" || oom != "/sys/fs/cgroup/pod/c/memory.events" {
		t.Errorf("v2: %q %q", procs, oom)
	}
	procs, oom = cgroupFiles(map[string]string{"devices": "/sys/fs/cgroup/devices/pod/c", "memory": "/sys/fs/cgroup/memory/pod/c",
		"": "/sys/fs/cgroup/unified/pod/c"}) // a hybrid host
	if procs != "/sys/fs/cgroup/devices/pod/c" || oom != "/sys/fs/cgroup/memory/pod/c/memory.oom_control" {
		t.Errorf("v1: %q %q", procs, oom)
	}
}

// TestCheckCRIUConfig: CRIU takes only the configuration file the bundle
// holds: a container whose label names another file, or none (one created
// before berth set it, for which libcontainer would give CRIU the host's
// runc.conf), is refused, and CRIU_CONFIG_FILE is not passed on.
func TestCheckCRIUConfig(t *testing.T) {
	const bundle = "/run/berth/pods/p/containers/c"
	for _, c := range []struct {
		labels []string
		ok     bool
	}{
		{[]string{"bundle=" + bundle, shim.AnnotationCRIUConfig + "=" + bundle + "/" + shim.CRIUConfigFile}, true},
		{[]string{"bundle=" + bundle}, false},
		{[]string{shim.AnnotationCRIUConfig + "=/proc/self/root/tmp/criu.conf"}, false},
		{[]string{shim.AnnotationCRIUConfig + "="}, false},
	} {
		t.Setenv("CRIU_CONFIG_FILE", "/tmp/elsewhere.conf")
		err := checkCRIUConfig("c", configs.Config{Labels: c.labels}, bundle)
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, shim.ErrCheckpoint)) {
			t.Errorf("labels %q: %v, want ok %v", c.labels, err, c.ok)
		}
		if _, set := os.LookupEnv("CRIU_CONFIG_FILE"); c.ok && set {
			t.Errorf("labels %q: CRIU_CONFIG_FILE is still set for CRIU", c.labels)
		}
	}
}
