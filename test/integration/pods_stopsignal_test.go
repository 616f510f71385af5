package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerStopSignal checks ContainerConfig.stop_signal (KEP-4960):
// StopContainer sends it rather than the image's STOPSIGNAL or SIGTERM,
// also after a berthd restart, and ContainerStatus.stop_signal reports the
// signal in force; an unknown one is refused naming the field.
func TestContainerStopSignal(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	quit := e.pushImage(t, "berth/busybox:stop-quit", v1.Config{StopSignal: "SIGQUIT"})
	cfg := e.podConfig("stopsignal")
	pod := e.runPod(t, cfg)

	// Each trap says which signal came; "ready" says the traps are set.
	const script = `for s in TERM QUIT USR1 USR2; do trap "echo got $s; exit 0" $s; done; ` +
		"echo ready; while :; do sleep 0.1; done"
	type ctr struct {
		id   string
		want runtimeapi.Signal
		got  string // what its trap says at stop
	}
	run := func(name, image string, sig runtimeapi.Signal, want runtimeapi.Signal, got string) ctr {
		cc := e.ctrConfig(name, "/bin/sh", "-c", script)
		if image != "" {
			cc.Image.Image = image
		}
		cc.StopSignal = sig
		id := e.runContainer(t, pod, cfg, cc)
		path := e.status(t, id).LogPath
		if !eventually(10*time.Second, func() bool { b, _ := os.ReadFile(path); return strings.Contains(string(b), " ready\n") }) {
			t.Fatalf("%s did not set its traps", name)
		}
		return ctr{id, want, got}
	}
	ctrs := []ctr{
		run("asked-usr1", "", runtimeapi.Signal_SIGNAL_SIGUSR1, runtimeapi.Signal_SIGNAL_SIGUSR1, "got USR1"),
		run("asked-over-image", quit, runtimeapi.Signal_SIGNAL_SIGUSR2, runtimeapi.Signal_SIGNAL_SIGUSR2, "got USR2"),
		run("image", quit, 0, runtimeapi.Signal_SIGNAL_SIGQUIT, "got QUIT"),
		run("default", "", 0, runtimeapi.Signal_SIGNAL_SIGTERM, "got TERM"),
	}
	check := func(when string) {
		for _, c := range ctrs {
			if got := e.status(t, c.id).StopSignal; got != c.want {
				t.Errorf("%s: %s: status stop_signal %s, want %s", when, c.id, got, c.want)
			}
		}
	}
	check("running")
	// The signal is the container's record's, not berthd's memory.
	e.d.Restart()
	check("after restart")
	for _, c := range ctrs {
		e.stop(t, c.id, 10)
		st := e.status(t, c.id)
		logged := strings.TrimSpace(logText(readLog(t, st.LogPath), "stdout"))
		if st.ExitCode != 0 || logged != "ready\n"+c.got {
			t.Errorf("%s stopped with exit code %d saying %q; want 0 and %q", st.Metadata.Name, st.ExitCode, logged, "ready\n"+c.got)
		}
	}
	check("exited")

	bad := e.ctrConfig("bad-signal", "/bin/true")
	bad.StopSignal = 999
	_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: pod, SandboxConfig: cfg, Config: bad})
	assertCode(t, err, one(codes.InvalidArgument), "stop_signal")

	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
