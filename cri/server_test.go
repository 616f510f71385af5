package cri

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// lockedBuffer collects log output written from the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func socketPath(t *testing.T) string {
	t.Helper()
	// Short: t.TempDir names can approach the 107-byte sun_path limit.
	dir, err := os.MkdirTemp("", "berth")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "run", "berth.sock")
}

// startServer serves opts on a fresh socket and returns a client connection.
func startServer(t *testing.T, opts ServerOptions) (*Server, *grpc.ClientConn) {
	t.Helper()
	if opts.Socket == "" {
		opts.Socket = socketPath(t)
	}
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	s := NewServer(opts)
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	conn, err := grpc.NewClient("unix://"+opts.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		s.Shutdown(5 * time.Second)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, conn
}

func TestSocketModeAndOwner(t *testing.T) {
	_, conn := startServer(t, ServerOptions{Runtime: NewRuntimeService(Config{}, nil, nil)})
	path := strings.TrimPrefix(conn.Target(), "unix://")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode = %v, want socket 0660", fi.Mode())
	}
	if os.Geteuid() == 0 {
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 {
			t.Errorf("socket owner = %d:%d, want 0:0", st.Uid, st.Gid)
		}
	}
	pfi, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if pfi.Mode().Perm() != 0o700 {
		t.Errorf("created socket dir mode = %v, want 0700", pfi.Mode().Perm())
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	path := socketPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	// A socket nobody listens on, as a SIGKILLed berthd leaves behind.
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	logs := &lockedBuffer{}
	_, conn := startServer(t, ServerOptions{
		Socket:  path,
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		Runtime: NewRuntimeService(Config{}, nil, nil),
	})
	if _, err := runtimeapi.NewRuntimeServiceClient(conn).Version(context.Background(), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatalf("Version on replaced socket: %v", err)
	}
	if !strings.Contains(logs.String(), "removing stale socket") {
		t.Errorf("no warning about the stale socket in %q", logs.String())
	}
}

func TestStaleRegularFileReplaced(t *testing.T) {
	path := socketPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	startServer(t, ServerOptions{Socket: path, Runtime: NewRuntimeService(Config{}, nil, nil)})
}

func TestLiveSocketRefused(t *testing.T) {
	first, conn := startServer(t, ServerOptions{Runtime: NewRuntimeService(Config{}, nil, nil)})
	path := strings.TrimPrefix(conn.Target(), "unix://")
	second := NewServer(ServerOptions{Socket: path, Logger: quietLogger()})
	err := second.Listen()
	if err == nil || !strings.Contains(err.Error(), "another berthd is serving on "+path) {
		t.Fatalf("second Listen = %v, want refusal naming %s", err, path)
	}
	// The first server must be untouched.
	if _, err := runtimeapi.NewRuntimeServiceClient(conn).Version(context.Background(), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatalf("first server broken by the refused second: %v", err)
	}
	_ = first
}

func TestSocketPathIsDirectory(t *testing.T) {
	path := socketPath(t)
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := NewServer(ServerOptions{Socket: path, Logger: quietLogger()}).Listen(); err == nil {
		t.Fatal("Listen on a directory: no error")
	}
}

func TestShutdownRemovesSocket(t *testing.T) {
	path := socketPath(t)
	s := NewServer(ServerOptions{Socket: path, Logger: quietLogger(), Runtime: NewRuntimeService(Config{}, nil, nil)})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	s.Shutdown(time.Second)
	if err := <-served; err != nil {
		t.Errorf("Serve after Shutdown = %v, want nil", err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket still there after Shutdown: %v", err)
	}
}

// A stream that never ends (like the kubelet's event stream) must not hold
// Shutdown past its bound.
func TestShutdownBounded(t *testing.T) {
	path := socketPath(t)
	s := NewServer(ServerOptions{Socket: path, Logger: quietLogger(), Runtime: &blockingEvents{}})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(context.Background(), &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil { // the call has reached the server
		t.Fatal(err)
	}
	start := time.Now()
	s.Shutdown(200 * time.Millisecond)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %v with a 200ms bound", d)
	}
}

type blockingEvents struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (blockingEvents) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	if err := s.SendHeader(nil); err != nil {
		return err
	}
	<-s.Context().Done()
	return s.Context().Err()
}

func TestCallLogging(t *testing.T) {
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, conn := startServer(t, ServerOptions{Logger: log, Runtime: NewRuntimeService(Config{}, nil, nil),
		Extension: NewExtensionServer(fakeImporter{})})
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx := context.Background()
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewExtensionClient(conn).Import(ctx, &runtimeapi.ImageSpec{Image: "relative"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Import(relative) = %v", err)
	}
	want := map[string]struct{ level, code string }{
		"/runtime.v1.RuntimeService/Version": {"DEBUG", "OK"},
		"/berth.v1.Images/Import":            {"INFO", "InvalidArgument"},
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Level, Msg, Method, Code, Err string
			Duration                      int64
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		w, ok := want[rec.Method]
		if !ok || rec.Msg != "cri call" {
			continue
		}
		delete(want, rec.Method)
		if rec.Level != w.level || rec.Code != w.code {
			t.Errorf("%s logged at %s with code %s, want %s %s", rec.Method, rec.Level, rec.Code, w.level, w.code)
		}
		if rec.Code != "OK" && !strings.Contains(rec.Err, "absolute path") {
			t.Errorf("%s: error message not logged: %q", rec.Method, rec.Err)
		}
	}
	if len(want) > 0 {
		t.Errorf("calls not logged: %v\nlogs:\n%s", want, logs.String())
	}
}

// The kubelet repeats a call berth lacks, or one that fails for a pod, every
// few seconds: the operator sees it at warn once per window, with the count
// held back, not every time; the same failure for another pod is news.
func TestUnimplementedWarnsOncePerWindow(t *testing.T) {
	logs := &lockedBuffer{}
	calls := newCallLog(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	unimplemented := status.Error(codes.Unimplemented, "method CheckpointContainer not implemented")
	const method = "/runtime.v1.RuntimeService/CheckpointContainer"
	for range 3 {
		calls.record(context.Background(), method, time.Now(), unimplemented)
	}
	for _, w := range calls.warned {
		w.at = time.Now().Add(-warnEvery) // the window has passed
	}
	calls.record(context.Background(), method, time.Now(), unimplemented)
	internal := status.Error(codes.Internal, "no space left on device")
	const run = "/runtime.v1.RuntimeService/RunPodSandbox"
	for _, pod := range []string{"web-0", "web-0", "web-1"} {
		calls.record(context.Background(), run, time.Now(), internal, "pod", pod, "namespace", "shop")
	}

	var levels []string
	var suppressed []int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Level      string
			Suppressed int
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		levels, suppressed = append(levels, rec.Level), append(suppressed, rec.Suppressed)
	}
	if !slices.Equal(levels, []string{"WARN", "DEBUG", "DEBUG", "WARN", "WARN", "DEBUG", "WARN"}) || suppressed[3] != 2 {
		t.Errorf("levels %v, suppressed %v; want WARN DEBUG DEBUG WARN with 2 held back, then WARN DEBUG for web-0 and WARN for web-1\n%s",
			levels, suppressed, logs.String())
	}
	if len(calls.warned) != 3 {
		t.Errorf("%d warn windows, want 3 (CheckpointContainer, web-0, web-1)", len(calls.warned))
	}
	for _, w := range calls.warned {
		w.at = time.Now().Add(-warnEvery)
	}
	calls.record(context.Background(), run, time.Now(), internal, "pod", "web-2", "namespace", "shop")
	if len(calls.warned) != 1 {
		t.Errorf("%d warn windows after the others passed, want web-2's alone", len(calls.warned))
	}
}

// A berthd that crashed between binding its socket and moving it into place
// left its bind folder beside the socket; the next start removes it, and
// leaves alone the bind folder of a berthd that still runs (pid 1 here).
func TestStaleBindFolderRemoved(t *testing.T) {
	path := socketPath(t)
	pidMax, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	dead := bindDir(filepath.Dir(path), mustAtoi(t, strings.TrimSpace(string(pidMax)))) // no process has pid_max
	live := bindDir(filepath.Dir(path), 1)
	for _, dir := range []string{dead, live} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "s"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	startServer(t, ServerOptions{Socket: path, Runtime: NewRuntimeService(Config{}, nil, nil)})
	if _, err := os.Lstat(dead); !os.IsNotExist(err) {
		t.Errorf("bind folder of a dead berthd still there after Listen: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(live, "s")); err != nil {
		t.Errorf("bind folder of a running berthd touched: %v", err)
	}
	if _, err := os.Lstat(bindDir(filepath.Dir(path), os.Getpid())); !os.IsNotExist(err) {
		t.Errorf("Listen left its own bind folder: %v", err)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A socket path of the most bytes sun_path holds binds: the folder it is
// bound in first must not lengthen the name bound.
func TestLongestSocketPathListens(t *testing.T) {
	dir := filepath.Dir(socketPath(t))
	const longest = 107
	pad := longest - len(dir) - len("//b.sock")
	if pad < 1 {
		t.Skipf("temp folder %s too long to build a %d-byte socket path", dir, longest)
	}
	path := filepath.Join(dir, strings.Repeat("x", pad), "b.sock")
	if len(path) != longest {
		t.Fatalf("built a %d-byte path, want %d", len(path), longest)
	}
	startServer(t, ServerOptions{Socket: path, Runtime: NewRuntimeService(Config{}, nil, nil)})
}
