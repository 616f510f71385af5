package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// TestContainerExecSync checks ExecSync: exit code and both streams, the
// container's environment and working dir, the timeout (the command and
// what it started are killed, DeadlineExceeded comes back in time), a
// caller that leaves an exec without a timeout, the 16 MiB output cap, and
// exec in a container that does not run.
func TestContainerExecSync(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath, "FROM_IMAGE=image"}, WorkingDir: "/tmp"})
	cfg := e.podConfig("exec")
	pod := e.runPod(t, cfg)
	cc := e.ctrConfig("target", sleeper...)
	cc.Envs = []*runtimeapi.KeyValue{{Key: "FROM_CRI", Value: []byte("cri")}}
	ctr := e.runContainer(t, pod, cfg, cc)

	t.Run("results", func(t *testing.T) {
		for _, c := range []struct {
			name string
			cmd  []string
			want execResult
		}{
			{"exit-0", []string{"/bin/true"}, execResult{code: 0}},
			{"exit-1", []string{"/bin/false"}, execResult{code: 1}},
			{"streams-and-code", []string{"/bin/sh", "-c", "echo out; echo err >&2; printf partial; exit 42"},
				execResult{"out\npartial", "err\n", 42}},
			{"killed-by-signal", []string{"/bin/sh", "-c", "kill -9 $$"}, execResult{code: 137}},
			{"env-and-cwd", []string{"/bin/sh", "-c", "echo $FROM_IMAGE $FROM_CRI; pwd"}, execResult{stdout: "image cri\n/tmp\n"}},
			{"binary-output", []string{"/bin/busybox", "head", "-c", "4", "/dev/zero"}, execResult{stdout: "\x00\x00\x00\x00"}},
		} {
			if got := e.exec(t, ctr, c.cmd...); got != c.want {
				t.Errorf("%s: ExecSync = %+v, want %+v", c.name, got, c.want)
			}
		}
	})

	t.Run("timeout", func(t *testing.T) {
		// The marker names every process of this exec: the shell, a
		// background subshell and both sleeps (busybox sleep adds up its
		// arguments, so a unique fraction of a second rides along).
		marker := newMarker()
		script := "(/bin/sleep 1000 " + marker + ") & /bin/sleep 1000 " + marker + "; : " + marker
		var err error
		var took time.Duration
		if n := mostWithArg(marker, func() {
			begin := time.Now()
			_, err = e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"/bin/sh", "-c", script}, Timeout: 1})
			took = time.Since(begin)
		}); n < 3 {
			t.Errorf("at most %d processes carried the marker while the exec ran, want 3 or more", n)
		}
		assertCode(t, err, one(codes.DeadlineExceeded), "timed out")
		if took < time.Second || took > 5*time.Second {
			t.Errorf("ExecSync with a 1 s timeout returned after %s", took)
		}
		if !eventually(2*time.Second, func() bool { return len(harness.LiveProcessesWithArg(marker)) == 0 }) {
			t.Errorf("processes of the timed-out exec still alive: %v", harness.LiveProcessesWithArg(marker))
		}
		// The container itself is untouched.
		if st := e.status(t, ctr); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container is %s after the exec timed out", st.State)
		}
	})

	t.Run("caller-gone", func(t *testing.T) {
		// Without a timeout an exec runs as long as its caller waits: when
		// the caller gives up, the command and what it started are killed,
		// not left running with their output held in berth's buffer.
		marker := newMarker()
		script := "(/bin/sleep 1000 " + marker + ") & while :; do echo " + marker + "; /bin/sleep 0.1; done"
		var err error
		if n := mostWithArg(marker, func() {
			c, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			_, err = e.d.Runtime.ExecSync(c, &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"/bin/sh", "-c", script}})
		}); n < 2 {
			t.Errorf("at most %d processes carried the marker while the exec ran, want 2 or more", n)
		}
		assertCode(t, err, one(codes.DeadlineExceeded))
		if !eventually(5*time.Second, func() bool { return len(harness.LiveProcessesWithArg(marker)) == 0 }) {
			t.Errorf("processes of the exec whose caller left still alive: %v", harness.LiveProcessesWithArg(marker))
		}
	})

	t.Run("output-cap", func(t *testing.T) {
		// The kubelet's client takes messages of up to 16 MiB: so does this.
		call := func(script string) (*runtimeapi.ExecSyncResponse, error) {
			return e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"/bin/sh", "-c", script}, Timeout: 60},
				grpc.MaxCallRecvMsgSize(16<<20))
		}
		// Within the cap: all of it comes back.
		resp, err := call("/bin/busybox head -c 12582912 /dev/zero; /bin/busybox head -c 3000000 /dev/zero >&2")
		if err != nil || len(resp.Stdout) != 12<<20 || len(resp.Stderr) != 3000000 {
			t.Errorf("ExecSync of 12 MiB + 3 MB: %d + %d bytes, %v", len(resp.GetStdout()), len(resp.GetStderr()), err)
		}
		// Beyond it (stdout and stderr together: berth's cap is 16 MiB less
		// 1 KiB, so the answer fits a 16 MiB gRPC message): the rest is
		// discarded, as the CRI says, and the command finishes normally with
		// its own exit code.
		const capped = 16<<20 - 1<<10
		for name, c := range map[string]struct {
			script string
			code   int32
			stdout int // -1: any, with stderr making up the cap
		}{
			"stdout-20MiB":       {"/bin/busybox head -c 20971520 /dev/zero", 0, capped},
			"stdout-then-exit-3": {"/bin/busybox head -c 17000000 /dev/zero; exit 3", 3, capped},
			"both":               {"/bin/busybox head -c 9000000 /dev/zero; /bin/busybox head -c 9000000 /dev/zero >&2; exit 5", 5, -1},
		} {
			resp, err := call(c.script)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			got := len(resp.Stdout) + len(resp.Stderr)
			if resp.ExitCode != c.code || got != capped || (c.stdout >= 0 && len(resp.Stdout) != c.stdout) {
				t.Errorf("%s: exit code %d, %d + %d bytes; want %d and %d bytes in all", name, resp.ExitCode, len(resp.Stdout), len(resp.Stderr), c.code, capped)
			}
		}
		// A flood that never ends runs into its timeout, and nothing of it
		// is left running.
		marker := newMarker()
		resp, err = e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: ctr,
			Cmd: []string{"/bin/busybox", "cat", "/dev/zero", "/never/reached/" + marker}, Timeout: 2})
		assertCode(t, err, one(codes.DeadlineExceeded))
		if resp != nil {
			t.Errorf("a timed out flood answered %d bytes", len(resp.Stdout))
		}
		if !eventually(2*time.Second, func() bool { return len(harness.LiveProcessesWithArg(marker)) == 0 }) {
			t.Errorf("processes of the flooding exec still alive: %v", harness.LiveProcessesWithArg(marker))
		}
		if r := e.exec(t, ctr, "/bin/echo", "still fine"); r.stdout != "still fine\n" {
			t.Errorf("exec after the floods: %+v", r)
		}
	})

	t.Run("not-running", func(t *testing.T) {
		created := e.create(t, pod, cfg, e.ctrConfig("created", sleeper...))
		e.stop(t, ctr, 0)
		for _, id := range []string{created, ctr} {
			_, err := e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"/bin/true"}})
			assertCode(t, err, one(codes.FailedPrecondition), "not running")
		}
		_, err := e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: ctr})
		assertCode(t, err, one(codes.InvalidArgument), "cmd")
	})
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// mostWithArg runs fn and returns the most processes with marker among
// their arguments seen alive meanwhile, so that a check that they are gone
// means something. Polled, not sampled once: in the VM an exec takes most
// of a second to start.
func mostWithArg(marker string, fn func()) int {
	done := make(chan struct{})
	most := make(chan int, 1)
	go func() {
		n := 0
		for {
			n = max(n, len(harness.LiveProcessesWithArg(marker)))
			select {
			case <-done:
				most <- n
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	fn()
	close(done)
	return <-most
}

// newMarker is a unique argument that marks the processes of one exec: a
// fraction of a second, so that busybox sleep takes it too.
func newMarker() string { return fmt.Sprintf("0.%012d", rand.Int64N(1e12)) }
