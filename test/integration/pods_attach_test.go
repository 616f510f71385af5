package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// attachProtocols: SPDY, and WebSocket v4 (client-go's WebSocket executor
// speaks it when asked to; its default, v5, is the API server's).
var attachProtocols = []string{"spdy", "websocket"}

// streamAttach asks Attach for a URL and runs the stream on it.
func (e *podEnv) streamAttach(t *testing.T, ctx context.Context, proto string, req *runtimeapi.AttachRequest, opts remotecommand.StreamOptions) error {
	t.Helper()
	resp, err := e.d.Runtime.Attach(ctx, req)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	var ex remotecommand.Executor
	if proto == "websocket" {
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(&restclient.Config{}, http.MethodGet, resp.Url, "v4.channel.k8s.io")
	} else {
		ex, err = executors[0].new(resp.Url)
	}
	if err != nil {
		t.Fatalf("%s executor: %v", proto, err)
	}
	return ex.StreamWithContext(ctx, opts)
}

// attachUntil attaches to ctr's stdout until it shows want, then detaches.
func (e *podEnv) attachUntil(t *testing.T, proto, ctr, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var out harness.SyncBuffer
	ended := make(chan error, 1)
	go func() {
		ended <- e.streamAttach(t, ctx, proto, &runtimeapi.AttachRequest{ContainerId: ctr, Stdout: true},
			remotecommand.StreamOptions{Stdout: &out})
	}()
	if !eventually(15*time.Second, func() bool { return strings.Contains(out.String(), want) }) {
		t.Errorf("%s attach: stdout %q, want %q in it", proto, out.String(), want)
	}
	cancel()
	<-ended
}

// TestStreamingAttach attaches with kubectl's client library to the stdio
// the shim holds: live output over SPDY and WebSocket, stdin with
// stdin_once, a tty with resize (and its CRI log still written), and again
// after berthd restarted; no fd is left behind in berthd or the shim.
func TestStreamingAttach(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath}})
	cfg := e.podConfig("stream-attach")
	pod := e.runPod(t, cfg)
	ticker := e.runContainer(t, pod, cfg, e.ctrConfig("ticker", "sh", "-c", "while :; do echo tick; sleep 0.2; done"))

	// After a first attach, attaching and detaching leaves no fd behind in
	// berthd or the shim.
	e.attachUntil(t, "spdy", ticker, "tick\n")
	shimPID := e.shimPID(t, pod)
	fds, shimFDs := openFDs(t, e.d.PID()), openFDs(t, shimPID)
	for _, proto := range attachProtocols {
		t.Run(proto, func(t *testing.T) { e.attachUntil(t, proto, ticker, "tick\n") })
	}
	if !eventually(5*time.Second, func() bool {
		return openFDs(t, e.d.PID()) <= fds && openFDs(t, shimPID) <= shimFDs
	}) {
		t.Errorf("after the attaches ended berthd holds %d fds (%d before), the shim %d (%d before)",
			openFDs(t, e.d.PID()), fds, openFDs(t, shimPID), shimFDs)
	}

	// The ticker was created without stdin: what a client would type has
	// nowhere to go, so asking for it is refused, not dropped.
	_, err := e.d.Runtime.Attach(t.Context(), &runtimeapi.AttachRequest{ContainerId: ticker, Stdin: true, Stdout: true})
	assertCode(t, err, one(codes.FailedPrecondition), "stdin")

	t.Run("stdin-once", func(t *testing.T) {
		cc := e.ctrConfig("reader", "sh", "-c", `while read l; do echo "got $l"; done; echo stdin-closed`)
		cc.Stdin, cc.StdinOnce = true, true
		ctr := e.runContainer(t, pod, cfg, cc)
		var out harness.SyncBuffer
		inR, inW := io.Pipe()
		ended := make(chan error, 1)
		go func() {
			ended <- e.streamAttach(t, t.Context(), "spdy", &runtimeapi.AttachRequest{ContainerId: ctr, Stdin: true, Stdout: true},
				remotecommand.StreamOptions{Stdin: inR, Stdout: &out})
		}()
		// Output before the attach took hold is not replayed: repeat the
		// line until it comes back.
		if !eventually(10*time.Second, func() bool {
			inW.Write([]byte("hello\n"))
			return strings.Contains(out.String(), "got hello\n")
		}) {
			t.Fatalf("attach stdout %q, want the echo of stdin", out.String())
		}
		inW.Close() // the first attach's stdin ends: the container's closes
		select {
		case err := <-ended:
			if err != nil {
				t.Errorf("attach ended with %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("attach did not end when the container's stdin closed; stdout %q", out.String())
		}
		if !strings.Contains(out.String(), "stdin-closed\n") {
			t.Errorf("attach stdout %q: the container did not see stdin close", out.String())
		}
		if !eventually(10*time.Second, func() bool { return e.status(t, ctr).State == runtimeapi.ContainerState_CONTAINER_EXITED }) {
			t.Errorf("container still %s after its stdin closed", e.status(t, ctr).State)
		}
		_, err := e.d.Runtime.Attach(t.Context(), &runtimeapi.AttachRequest{ContainerId: ctr, Stdout: true})
		assertCode(t, err, one(codes.FailedPrecondition), "not running")
	})

	t.Run("tty-resize", func(t *testing.T) {
		cc := e.ctrConfig("tty", "sh", "-c", "while read l; do stty size; done")
		cc.Stdin, cc.Tty = true, true
		ctr := e.runContainer(t, pod, cfg, cc)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var out harness.SyncBuffer
		inR, inW := io.Pipe()
		size := &fixedSize{} // 123x45
		ended := make(chan error, 1)
		go func() {
			ended <- e.streamAttach(t, ctx, "spdy", &runtimeapi.AttachRequest{ContainerId: ctr, Stdin: true, Stdout: true, Tty: true},
				remotecommand.StreamOptions{Stdin: inR, Stdout: &out, Tty: true, TerminalSizeQueue: size})
		}()
		if !eventually(10*time.Second, func() bool {
			inW.Write([]byte("\n"))
			return strings.Contains(out.String(), "45 123")
		}) {
			t.Errorf("attach to a tty: stdout %q, want stty size 45 123", out.String())
		}
		cancel()
		<-ended
		if !eventually(5*time.Second, func() bool {
			return strings.Contains(logText(readLog(t, e.status(t, ctr).LogPath), "stdout"), "45 123")
		}) {
			t.Errorf("the tty container's CRI log lacks its output")
		}
	})

	t.Run("after-restart", func(t *testing.T) {
		e.d.Restart()
		e.attachUntil(t, "spdy", ticker, "tick\n")
	})
}
