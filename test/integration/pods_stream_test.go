package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/gorilla/websocket"
	"google.golang.org/grpc/codes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/berth-runtime/berth/test/harness"
)

// executors are the protocols kubectl's client library speaks to a
// streaming server directly. (Its WebSocket executor speaks only v5, which
// the API server translates to SPDY before a runtime sees it; WebSocket v4,
// which the runtime's server speaks, is driven by wsExec below.)
var executors = []struct {
	name string
	new  func(u string) (remotecommand.Executor, error)
}{
	{"spdy", func(u string) (remotecommand.Executor, error) {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, err
		}
		return remotecommand.NewSPDYExecutor(&restclient.Config{}, http.MethodPost, pu)
	}},
}

// fixedSize is a terminal size queue that reports one size, then ends.
type fixedSize struct{ sent bool }

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	if f.sent {
		return nil
	}
	f.sent = true
	return &remotecommand.TerminalSize{Width: 123, Height: 45}
}

// TestContainerExecStream drives the URL Exec returns with the client
// library kubectl uses, over SPDY and WebSocket: exit code, stdin round
// trip, a tty with its size, a client hanging up (the exec'd tree dies),
// tokens that are single use, and errors for unknown and stopped
// containers. berthd holds no more fds afterwards than before.
func TestContainerExecStream(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath}})
	cfg := e.podConfig("stream")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("target", sleeper...))
	execURL := func(t *testing.T, req *runtimeapi.ExecRequest) string {
		t.Helper()
		req.ContainerId = ctr
		resp, err := e.d.Runtime.Exec(t.Context(), req)
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		return resp.Url
	}
	// Warm up (the first stream starts the server's and client's pools),
	// then count berthd's fds.
	e.exec(t, ctr, "/bin/true")
	fdsBefore := openFDs(t, e.d.PID())

	for _, ex := range executors {
		t.Run(ex.name, func(t *testing.T) {
			stream := func(t *testing.T, ctx context.Context, u string, opts remotecommand.StreamOptions) error {
				t.Helper()
				x, err := ex.new(u)
				if err != nil {
					t.Fatal(err)
				}
				return x.StreamWithContext(ctx, opts)
			}
			t.Run("exit-code", func(t *testing.T) {
				var out, errb bytes.Buffer
				u := execURL(t, &runtimeapi.ExecRequest{Cmd: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, Stdout: true, Stderr: true})
				err := stream(t, t.Context(), u, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
				var ee utilexec.ExitError
				if !errors.As(err, &ee) || ee.ExitStatus() != 3 {
					t.Errorf("stream error = %v, want exit code 3", err)
				}
				if out.String() != "out\n" || errb.String() != "err\n" {
					t.Errorf("stdout %q stderr %q, want \"out\\n\" and \"err\\n\"", out.String(), errb.String())
				}
			})
			t.Run("stdin", func(t *testing.T) {
				var out bytes.Buffer
				in := strings.Repeat("round trip\n", 10000)
				u := execURL(t, &runtimeapi.ExecRequest{Cmd: []string{"/bin/cat"}, Stdin: true, Stdout: true})
				if err := stream(t, t.Context(), u, remotecommand.StreamOptions{Stdin: strings.NewReader(in), Stdout: &out}); err != nil {
					t.Fatalf("stream: %v", err)
				}
				if out.String() != in {
					t.Errorf("cat gave back %d bytes, want the %d sent", out.Len(), len(in))
				}
			})
			t.Run("tty", func(t *testing.T) {
				var out bytes.Buffer
				// The size is applied as soon as the stream is up; the
				// sleep lets it arrive before stty reads it.
				u := execURL(t, &runtimeapi.ExecRequest{Cmd: []string{"/bin/sh", "-c", "sleep 0.5; stty size; tty"}, Stdout: true, Tty: true})
				err := stream(t, t.Context(), u, remotecommand.StreamOptions{Stdout: &out, Tty: true, TerminalSizeQueue: &fixedSize{}})
				if err != nil {
					t.Fatalf("stream: %v", err)
				}
				if !strings.Contains(out.String(), "45 123") || !strings.Contains(out.String(), "/dev/pts/") {
					t.Errorf("tty exec printed %q, want the size \"45 123\" and a /dev/pts terminal", out.String())
				}
			})
			t.Run("hang-up", func(t *testing.T) {
				marker := newMarker()
				u := execURL(t, &runtimeapi.ExecRequest{Cmd: []string{"/bin/sh", "-c", "(/bin/sleep 1000 " + marker + ") & /bin/sleep 1000 " + marker}, Stdin: true, Stdout: true})
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				pr, pw := io.Pipe()
				defer pw.Close()
				go func() { done <- stream(t, ctx, u, remotecommand.StreamOptions{Stdin: pr, Stdout: io.Discard}) }()
				if !eventually(5*time.Second, func() bool { return len(harness.LiveProcessesWithArg(marker)) >= 2 }) {
					t.Fatalf("the exec'd processes did not start")
				}
				cancel()
				<-done
				if !eventually(5*time.Second, func() bool { return len(harness.LiveProcessesWithArg(marker)) == 0 }) {
					t.Errorf("processes of the exec still alive after the client hung up: %v", harness.LiveProcessesWithArg(marker))
				}
			})
			t.Run("token-single-use", func(t *testing.T) {
				u := execURL(t, &runtimeapi.ExecRequest{Cmd: []string{"/bin/true"}, Stdout: true})
				if err := stream(t, t.Context(), u, remotecommand.StreamOptions{Stdout: io.Discard}); err != nil {
					t.Fatalf("first use: %v", err)
				}
				for _, bad := range []string{u, u[:strings.LastIndex(u, "/")+1] + "unknowntoken"} {
					resp, err := http.Post(bad, "", nil)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusNotFound {
						t.Errorf("POST %s: %s, want 404", bad, resp.Status)
					}
				}
			})
		})
	}

	t.Run("websocket-v4", func(t *testing.T) {
		u := execURL(t, &runtimeapi.ExecRequest{Cmd: []string{"/bin/sh", "-c", "echo out; exit 3"}, Stdout: true})
		out, status := wsExec(t, u, nil)
		if out != "out\n" || !strings.Contains(status, `"ExitCode"`) || !strings.Contains(status, `"message":"3"`) {
			t.Errorf("websocket exec: stdout %q, status %s; want \"out\\n\" and exit code 3", out, status)
		}
		marker := newMarker()
		u = execURL(t, &runtimeapi.ExecRequest{Cmd: []string{"/bin/sleep", "1000", marker}, Stdout: true})
		wsExec(t, u, func() {
			if !eventually(5*time.Second, func() bool { return len(harness.LiveProcessesWithArg(marker)) == 1 }) {
				t.Errorf("the exec'd sleep did not start")
			}
		})
		if !eventually(5*time.Second, func() bool { return len(harness.LiveProcessesWithArg(marker)) == 0 }) {
			t.Errorf("exec still alive after the websocket client hung up: %v", harness.LiveProcessesWithArg(marker))
		}
	})

	t.Run("errors", func(t *testing.T) {
		_, err := e.d.Runtime.Exec(t.Context(), &runtimeapi.ExecRequest{ContainerId: "nosuchcontainer", Cmd: []string{"/bin/true"}, Stdout: true})
		assertCode(t, err, one(codes.NotFound), "nosuchcontainer")
		_, err = e.d.Runtime.Exec(t.Context(), &runtimeapi.ExecRequest{ContainerId: ctr, Stdout: true})
		assertCode(t, err, one(codes.InvalidArgument), "cmd")
		_, err = e.d.Runtime.Exec(t.Context(), &runtimeapi.ExecRequest{ContainerId: ctr, Cmd: []string{"/bin/true"}})
		assertCode(t, err, one(codes.InvalidArgument), "stdin")
		done := e.runContainer(t, pod, cfg, e.ctrConfig("done", sleeper...))
		e.stop(t, done, 0)
		_, err = e.d.Runtime.Exec(t.Context(), &runtimeapi.ExecRequest{ContainerId: done, Cmd: []string{"/bin/true"}, Stdout: true})
		assertCode(t, err, one(codes.FailedPrecondition), "not running")
	})

	if !eventually(5*time.Second, func() bool { return openFDs(t, e.d.PID()) <= fdsBefore }) {
		t.Errorf("berthd holds %d fds after the streams ended, %d before", openFDs(t, e.d.PID()), fdsBefore)
	}
}

// wsExec speaks the client side of remotecommand v4 over WebSocket (each
// message starts with its channel: 1 stdout, 3 status). With hangUp, it
// calls it once connected and then closes the connection; otherwise it
// reads to the end and returns stdout and the status message.
func wsExec(t *testing.T, u string, hangUp func()) (stdout, status string) {
	t.Helper()
	dialer := websocket.Dialer{Subprotocols: []string{"v4.channel.k8s.io"}}
	conn, resp, err := dialer.DialContext(t.Context(), "ws"+strings.TrimPrefix(u, "http"), nil)
	if err != nil {
		t.Fatalf("websocket dial: %v", err)
	}
	resp.Body.Close()
	defer conn.Close()
	if hangUp != nil {
		hangUp()
		return "", ""
	}
	var out strings.Builder
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			return out.String(), status
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case 1:
			out.Write(msg[1:])
		case 3:
			status += string(msg[1:])
		}
	}
}

// openFDs counts the open files of pid.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	n, err := harness.OpenFDs(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
