package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// previousShimRevision is the last commit whose berth-shim ran libcontainer
// in the per-pod process itself (one binary, no berth-shim-helper). Shims
// of that build keep running their pods across an upgrade of berth.
const previousShimRevision = "86c0fcf08a095043a47c76679705d2cd8c931909"

// buildPreviousShim builds the berth-shim of previousShimRevision from the
// repository's history into a folder of its own, with berth-pause,
// berth-shim-helper and berth-exec-init of this build beside it (berthd
// looks for them there; the old shim uses none of them).
func buildPreviousShim(t *testing.T) string {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src, dir := t.TempDir(), t.TempDir()
	tarball := filepath.Join(src, "previous.tar")
	for _, args := range [][]string{
		{"git", "-C", root, "archive", "-o", tarball, previousShimRevision, "go.mod", "go.sum", "cmd/berth-shim", "sandbox/shim"},
		{"tar", "-x", "-f", tarball, "-C", src},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	build := exec.Command("go", "build", "-trimpath", "-tags", harness.ShimBuildTags, "-ldflags", "-extldflags -static",
		"-o", filepath.Join(dir, "berth-shim"), "./cmd/berth-shim")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the previous shim: %v\n%s", err, out)
	}
	for _, name := range []string{"berth-pause", "berth-shim-helper", "berth-exec-init"} {
		b, err := os.ReadFile(harness.BinaryPath(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "berth-shim")
}

// setShimBinary rewrites berthd's config file with shim_binary set to bin
// ("" removes it: the shim beside berthd), for its next start.
func setShimBinary(t *testing.T, d *harness.Daemon, bin string) {
	t.Helper()
	b, err := os.ReadFile(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "shim_binary") {
			lines = append(lines, l)
		}
	}
	if bin != "" {
		// Top-level keys come before the first table.
		lines = append([]string{`shim_binary = "` + bin + `"`}, lines...)
	}
	if err := os.WriteFile(d.Config, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestShimUpgradeKeepsOldPods: pods started by the previous berth-shim (one
// process per pod running libcontainer itself) keep working under a berthd
// whose shim is the new pair (a small shim and its helper): berthd is
// killed, its shim binary swapped, and started again; the old pods are
// recovered READY with their containers running, their logs keep flowing
// and stay readable, exec, a new container and StopContainer work through
// the old shim, and the pods stop and go without leaks. A pod started after
// the upgrade gets the new shim.
func TestShimUpgradeKeepsOldPods(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	oldShim := buildPreviousShim(t)
	setShimBinary(t, e.d, oldShim)
	e.d.Restart()

	cfg := e.podConfig("upgrade-old")
	pod := e.runPod(t, cfg)
	ticker := e.runContainer(t, pod, cfg, e.ctrConfig("ticker", "/bin/sh", "-c", tickerScript))
	sleeper1 := e.runContainer(t, pod, cfg, e.ctrConfig("sleeper", sleeper...))
	oldPID := e.shimPID(t, pod)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", oldPID)); err != nil || exe != oldShim {
		t.Fatalf("the pod's shim runs %q (%v), want the previous shim %s", exe, err, oldShim)
	}
	logPath := e.status(t, ticker).LogPath
	tickerPID := e.ctrPID(t, ticker)

	e.d.Kill()
	setShimBinary(t, e.d, "")
	atKill := ticks(t, logPath)
	if !eventually(5*time.Second, func() bool { return ticks(t, logPath) >= atKill+3 }) {
		t.Errorf("the old pod stopped logging while berthd was down (%d lines)", ticks(t, logPath))
	}
	e.d.Restart()

	if st := e.podStatus(t, pod); st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("old pod is %s after the upgrade", st.State)
	}
	if pid := e.shimPID(t, pod); pid != oldPID || !alive(pid) {
		t.Errorf("old pod's shim: pid %d (alive %v), was %d", pid, alive(pid), oldPID)
	}
	for _, c := range []string{ticker, sleeper1} {
		if st := e.status(t, c); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container %s is %s after the upgrade", c, st.State)
		}
	}
	if pid := e.ctrPID(t, ticker); pid != tickerPID || !alive(pid) {
		t.Errorf("ticker: pid %d (alive %v), was %d", pid, alive(pid), tickerPID)
	}
	atRestart := ticks(t, logPath)
	if !eventually(5*time.Second, func() bool { return ticks(t, logPath) >= atRestart+3 }) {
		t.Errorf("the old pod's container wrote no line after the upgrade (%d lines)", atRestart)
	}
	if r := e.exec(t, ticker, "/bin/echo", "old shim"); r.stdout != "old shim\n" {
		t.Errorf("exec through the old shim: %+v", r)
	}
	c := e.runContainer(t, pod, cfg, e.ctrConfig("after-upgrade", sleeper...))
	if r := e.exec(t, c, "/bin/true"); r.code != 0 {
		t.Errorf("exec in a container the old shim made after the upgrade: %+v", r)
	}
	e.stop(t, ticker, 0)
	if st := e.status(t, ticker); st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 || alive(tickerPID) {
		t.Errorf("ticker after StopContainer: %s, exit code %d, process alive %v", st.State, st.ExitCode, alive(tickerPID))
	}
	if n := ticks(t, logPath); n < atRestart+3 {
		t.Errorf("the old pod's log has %d lines after the upgrade, want at least %d", n, atRestart+3)
	}

	newCfg := e.podConfig("upgrade-new")
	newPod := e.runPod(t, newCfg)
	e.runContainer(t, newPod, newCfg, e.ctrConfig("sleeper", sleeper...))
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", e.shimPID(t, newPod))); err != nil || exe != harness.BinaryPath(t, "berth-shim") {
		t.Errorf("a pod started after the upgrade runs shim %q (%v), want %s", exe, err, harness.BinaryPath(t, "berth-shim"))
	}

	e.removePod(t, pod)
	e.removePod(t, newPod)
	if alive(oldPID) {
		t.Errorf("the old shim (pid %d) outlived its pod", oldPID)
	}
	e.assertNoLeaks(t)
}
