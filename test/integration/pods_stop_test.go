package integration

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerStop checks StopContainer: the stop signal (SIGTERM, or the
// image's StopSignal), SIGKILL once the timeout has passed, the call
// returning within the timeout, the exit code and reason it leaves, and
// stopping containers that do not run.
func TestContainerStop(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	usr1 := e.pushImage(t, "berth/busybox:stop-usr1", v1.Config{StopSignal: "SIGUSR1"})
	cfg := e.podConfig("stop")
	pod := e.runPod(t, cfg)

	// Each trap says which signal came; "ready" says the traps are set; the
	// loop keeps the shell waiting for short sleeps, so a trap runs promptly.
	const traps = `trap "echo got TERM; exit 0" TERM; trap "echo got USR1; exit 0" USR1; `
	const loop = "echo ready; while :; do sleep 0.1; done"
	for _, c := range []struct {
		name     string
		image    string
		script   string
		timeout  int64
		min, max time.Duration // how long StopContainer may take
		code     int32
		reason   string
		logged   string // what the container said, if anything
		// removeImage removes the container's image before the stop: the
		// stop signal must not depend on it.
		removeImage bool
	}{
		{name: "ignores-term", script: `trap "" TERM; ` + loop, timeout: 2,
			min: 2 * time.Second, max: 4 * time.Second, code: 137, reason: "Error", logged: "ready"},
		{name: "handles-term", script: traps + loop, timeout: 10,
			max: 3 * time.Second, code: 0, reason: "Completed", logged: "ready\ngot TERM"},
		{name: "image-stop-signal", image: usr1, script: traps + loop, timeout: 10,
			max: 3 * time.Second, code: 0, reason: "Completed", logged: "ready\ngot USR1"},
		{name: "image-stop-signal-after-image-removal", image: usr1, removeImage: true, script: traps + loop, timeout: 10,
			max: 3 * time.Second, code: 0, reason: "Completed", logged: "ready\ngot USR1"},
		{name: "timeout-0-kills", script: traps + loop, timeout: 0,
			max: 2 * time.Second, code: 137, reason: "Error", logged: "ready"},
		{name: "exit-code-kept", script: `trap "exit 3" TERM; ` + loop, timeout: 10,
			max: 3 * time.Second, code: 3, reason: "Error", logged: "ready"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc := e.ctrConfig(c.name, "/bin/sh", "-c", c.script)
			if c.image != "" {
				cc.Image.Image = c.image
			}
			ctr := e.runContainer(t, pod, cfg, cc)
			path := e.status(t, ctr).LogPath
			if !eventually(10*time.Second, func() bool { b, _ := os.ReadFile(path); return strings.Contains(string(b), " ready\n") }) {
				t.Fatal("the container did not set its traps")
			}
			if c.removeImage {
				if _, err := e.d.Images.RemoveImage(t.Context(), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: c.image}}); err != nil {
					t.Fatal(err)
				}
				if st, err := e.d.Images.ImageStatus(t.Context(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: c.image}}); err != nil || st.Image != nil {
					t.Fatalf("image still there after RemoveImage: %v %v", st.GetImage(), err)
				}
			}
			begin := time.Now()
			e.stop(t, ctr, c.timeout)
			took := time.Since(begin)
			if took < c.min || took > c.max {
				t.Errorf("StopContainer (timeout %d s) took %s, want %s to %s", c.timeout, took, c.min, c.max)
			}
			st := e.status(t, ctr)
			if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != c.code || st.Reason != c.reason {
				t.Errorf("stopped: %s, exit code %d, reason %q; want EXITED, %d, %q", st.State, st.ExitCode, st.Reason, c.code, c.reason)
			}
			if st.FinishedAt < begin.UnixNano() || st.FinishedAt > time.Now().UnixNano() {
				t.Errorf("finished_at %d is not within the stop call", st.FinishedAt)
			}
			logged := strings.TrimSpace(logText(readLog(t, st.LogPath), "stdout"))
			if logged != c.logged {
				t.Errorf("container said %q, want %q", logged, c.logged)
			}
			// Stopping again changes nothing.
			e.stop(t, ctr, c.timeout)
			if again := e.status(t, ctr); again.ExitCode != st.ExitCode || again.FinishedAt != st.FinishedAt {
				t.Errorf("a second stop changed the status: %v", again)
			}
		})
	}

	t.Run("created", func(t *testing.T) {
		ctr := e.create(t, pod, cfg, e.ctrConfig("never-started", sleeper...))
		begin := time.Now()
		e.stop(t, ctr, 2)
		if took := time.Since(begin); took > 4*time.Second {
			t.Errorf("StopContainer of a created container took %s", took)
		}
		if st := e.status(t, ctr); st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Errorf("stopped created container is %s", st.State)
		}
	})
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestStopContainerStuck: a container that survives SIGKILL (its freezer
// cgroup frozen, where a pending SIGKILL waits) makes StopContainer fail
// instead of reporting it stopped; once thawed, the retry stops it.
func TestStopContainerStuck(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("stuck")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("c", sleeper...))
	state := freezerStateOf(t, ctr)
	if err := os.WriteFile(state, []byte("FROZEN"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(state, []byte("THAWED"), 0o644) })

	_, err := e.d.Runtime.StopContainer(t.Context(), &runtimeapi.StopContainerRequest{ContainerId: ctr, Timeout: 0})
	assertCode(t, err, one(codes.DeadlineExceeded), ctr, "after SIGKILL")
	if got := e.status(t, ctr).State; got != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("state after the failed stop = %v, want RUNNING", got)
	}
	if err := os.WriteFile(state, []byte("THAWED"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.stop(t, ctr, 0)
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// freezerStateOf finds the freezer.state of a container's v1 freezer cgroup,
// or skips where there is no v1 freezer (v2 kills frozen tasks).
func freezerStateOf(t *testing.T, ctr string) string {
	t.Helper()
	var found string
	filepath.WalkDir("/sys/fs/cgroup/freezer", func(p string, d fs.DirEntry, err error) error {
		if err == nil && found == "" && d.IsDir() && strings.Contains(d.Name(), ctr) {
			found = filepath.Join(p, "freezer.state")
		}
		return nil
	})
	if found == "" {
		t.Skipf("no cgroup v1 freezer for container %s: this kernel setup lets SIGKILL end frozen tasks", ctr)
	}
	return found
}
