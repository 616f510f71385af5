package integration

import (
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

// TestStopContainerStuck: a container that survives SIGKILL (stuck in the
// kernel, waiting for a FUSE answer that never comes) makes StopContainer
// fail instead of reporting it stopped; once the FUSE connection is aborted,
// the retry stops it and nothing is left over.
func TestStopContainerStuck(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	// After the env: its cleanup (the connection's abort) then runs before
	// the env's teardown, which could not remove a stuck container.
	stuck := mountStuckFS(t)
	cfg := e.podConfig("stuck")
	pod := e.runPod(t, cfg)
	cc := e.ctrConfig("c", "/bin/cat", "/fuse/stuck")
	cc.Mounts = []*runtimeapi.Mount{{HostPath: stuck.dir, ContainerPath: "/fuse"}}
	ctr := e.runContainer(t, pod, cfg, cc)
	select {
	case <-stuck.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the container did not look /fuse/stuck up")
	}

	_, err := e.d.Runtime.StopContainer(t.Context(), &runtimeapi.StopContainerRequest{ContainerId: ctr, Timeout: 0})
	assertCode(t, err, one(codes.DeadlineExceeded), ctr, "after SIGKILL")
	if got := e.status(t, ctr).State; got != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("state after the failed stop = %v, want RUNNING", got)
	}
	stuck.release()
	e.stop(t, ctr, 0)
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
	stuck.unmount(t)
	// A container another test is creating meanwhile holds a copy of the
	// host's mounts, this one too, until it pivots into its root: such
	// copies go within moments; a process that keeps one is a leak.
	var pids []string
	if !eventually(time.Minute, func() bool { pids = mountedAnywhere(stuck.source); return len(pids) == 0 }) {
		t.Errorf("the FUSE mount is still held by processes %v", processNames(pids))
	}
}

// processNames is each of pids with its command line, for a message.
func processNames(pids []string) []string {
	var out []string
	for _, pid := range pids {
		cmd, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		out = append(out, pid+" "+strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	return out
}
