package cri

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/berth-runtime/berth/sandbox"
)

// StreamOptions configure the streaming server (the [stream] section).
type StreamOptions struct {
	Address     string
	Port        int // 0: a free port
	IdleTimeout time.Duration
	// TLSCert and TLSKey, both or neither, serve https.
	TLSCert, TLSKey string
}

// StreamServer serves the URLs Exec, Attach and PortForward return: the
// kubelet's streaming library (SPDY and WebSocket remotecommand and
// port-forward) on a TCP listener, with single-use tokens.
type StreamServer struct {
	lib  streaming.Server
	http *http.Server
	ln   net.Listener
	tls  bool
}

// NewStreamServer listens at once, so the URLs handed out name the real
// port even when the configured one is 0.
func NewStreamServer(opts StreamOptions, pods *sandbox.Manager) (*StreamServer, error) {
	cfg := streaming.DefaultConfig
	if opts.IdleTimeout > 0 {
		cfg.StreamIdleTimeout = opts.IdleTimeout
	}
	var tlsCfg *tls.Config
	if opts.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(opts.TLSCert, opts.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("stream tls: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(opts.Address, strconv.Itoa(opts.Port)))
	if err != nil {
		return nil, fmt.Errorf("stream server: %w", err)
	}
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	cfg.Addr = ln.Addr().String()
	cfg.BaseURL = &url.URL{Scheme: scheme, Host: ln.Addr().String()}
	cfg.TLSConfig = tlsCfg
	lib, err := streaming.NewServer(cfg, &streamRuntime{pods: pods})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &StreamServer{lib: lib, ln: ln, tls: tlsCfg != nil}
	s.http = &http.Server{Handler: hangupHandler(lib), TLSConfig: tlsCfg, ReadHeaderTimeout: 30 * time.Second}
	return s, nil
}

// Addr is where the server listens.
func (s *StreamServer) Addr() string { return s.ln.Addr().String() }

// Serve answers until Shutdown.
func (s *StreamServer) Serve() error {
	var err error
	if s.tls {
		err = s.http.ServeTLS(s.ln, "", "")
	} else {
		err = s.http.Serve(s.ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown closes the listener and every stream: a client sees its exec
// end, and the shim kills the exec'd process.
func (s *StreamServer) Shutdown() {
	s.http.Close()
}

// streamRuntime runs what the library's handlers ask for.
type streamRuntime struct {
	pods *sandbox.Manager
}

// execStreams converts the library's streams.
func execStreams(in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) sandbox.ExecStreams {
	streams := sandbox.ExecStreams{TTY: tty, Resize: termSizes(resize)}
	// The library hands typed nil interfaces for streams not asked for.
	if in != nil {
		streams.Stdin = in
	}
	if out != nil {
		streams.Stdout = out
	}
	if errw != nil && !tty {
		streams.Stderr = errw
	}
	return streams
}

func (r *streamRuntime) Exec(ctx context.Context, id string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	code, err := r.pods.ExecStream(ctx, id, cmd, execStreams(in, out, errw, tty, resize))
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command exited with %d", code), Code: code}
	}
	return nil
}

func (r *streamRuntime) Attach(ctx context.Context, id string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	return r.pods.Attach(ctx, id, execStreams(in, out, errw, tty, resize))
}

func (r *streamRuntime) PortForward(ctx context.Context, podID string, port int32, stream io.ReadWriteCloser) error {
	return r.pods.PortForward(ctx, podID, port, stream)
}

// termSizes converts the library's resize events.
func termSizes(in <-chan remotecommand.TerminalSize) <-chan sandbox.TermSize {
	if in == nil {
		return nil
	}
	out := make(chan sandbox.TermSize)
	go func() {
		defer close(out)
		for s := range in {
			out <- sandbox.TermSize{Width: s.Width, Height: s.Height}
		}
	}()
	return out
}

// hangupHandler gives each request a context that ends when the client's
// connection does. The library hijacks the connection for SPDY and
// WebSocket, and a hijacked request's context never ends by itself, so
// without this a client that went away would leave its exec running.
func hangupHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		h.ServeHTTP(&hangupWriter{ResponseWriter: w, cancel: cancel}, r.WithContext(ctx))
	})
}

type hangupWriter struct {
	http.ResponseWriter
	cancel context.CancelFunc
}

// Hijack hands out the connection wrapped, so a read error (the client
// hung up) or its close ends the request's context.
func (w *hangupWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	c := &hangupConn{Conn: conn, cancel: w.cancel}
	buffered, _ := rw.Reader.Peek(rw.Reader.Buffered())
	r := io.MultiReader(bytes.NewReader(bytes.Clone(buffered)), c)
	return c, bufio.NewReadWriter(bufio.NewReader(r), rw.Writer), nil
}

func (w *hangupWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

type hangupConn struct {
	net.Conn
	cancel context.CancelFunc
	once   sync.Once
}

func (c *hangupConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(c.cancel)
	}
	return n, err
}

func (c *hangupConn) Close() error {
	c.once.Do(c.cancel)
	return c.Conn.Close()
}

// Exec checks the container runs and returns a single-use URL.
func (r *RuntimeService) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	if r.stream == nil {
		return nil, status.Error(codes.Unimplemented, "berthd runs without a streaming server")
	}
	if len(req.GetCmd()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "cmd is required")
	}
	if err := r.pods.CheckRunning(ctx, req.GetContainerId()); err != nil {
		return nil, grpcError(err)
	}
	return r.stream.lib.GetExec(req)
}

// Attach checks the container runs and returns a single-use URL.
func (r *RuntimeService) Attach(ctx context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	if r.stream == nil {
		return nil, status.Error(codes.Unimplemented, "berthd runs without a streaming server")
	}
	if err := r.pods.CheckRunning(ctx, req.GetContainerId()); err != nil {
		return nil, grpcError(err)
	}
	c, err := r.pods.GetContainer(req.GetContainerId())
	if err != nil {
		return nil, grpcError(err)
	}
	// A container created without stdin has nowhere to send it: refuse
	// rather than drop what the client types.
	if req.GetStdin() && !c.Config.GetStdin() {
		return nil, status.Errorf(codes.FailedPrecondition, "stdin: container %s was created without stdin (config.stdin is false)", c.ID)
	}
	return r.stream.lib.GetAttach(req)
}

// PortForward checks the pod is ready and returns a single-use URL.
func (r *RuntimeService) PortForward(ctx context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	if r.stream == nil {
		return nil, status.Error(codes.Unimplemented, "berthd runs without a streaming server")
	}
	pod, err := r.pods.GetPod(req.GetPodSandboxId())
	if err != nil {
		return nil, grpcError(err)
	}
	if pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.FailedPrecondition, "pod %s is not ready", pod.ID)
	}
	for _, p := range req.GetPort() {
		if p <= 0 || p > 65535 {
			return nil, status.Errorf(codes.InvalidArgument, "port %d: must be 1 to 65535", p)
		}
	}
	return r.stream.lib.GetPortForward(&runtimeapi.PortForwardRequest{PodSandboxId: pod.ID, Port: req.Port})
}
