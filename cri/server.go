package cri

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxMsgSize matches containerd and CRI-O: ListContainers/ListImages answers on
// a busy node exceed gRPC's 4 MiB default.
const maxMsgSize = 16 << 20

// ServerOptions says where to listen and what to serve there.
type ServerOptions struct {
	Socket    string
	Logger    *slog.Logger
	Runtime   runtimeapi.RuntimeServiceServer
	Images    runtimeapi.ImageServiceServer // nil: not registered
	Extension ExtensionServer               // nil: not registered
	// Metrics takes berth_cri_request_duration_seconds; nil: none.
	Metrics prometheus.Registerer
}

// Server serves the CRI and berth's extension on one unix socket.
type Server struct {
	socket string
	log    *slog.Logger
	grpc   *grpc.Server
	ln     net.Listener
}

// NewServer builds the gRPC server; Listen and Serve start it.
func NewServer(opts ServerOptions) *Server {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	calls := &callObserver{log: newCallLog(log), metrics: newRequestMetrics(opts.Metrics)}
	if d, ok := opts.Runtime.(callDescriber); ok {
		calls.describe = d.describeCall
	}
	g := grpc.NewServer(
		grpc.MaxRecvMsgSize(maxMsgSize),
		grpc.MaxSendMsgSize(maxMsgSize),
		grpc.ChainUnaryInterceptor(calls.unary),
		grpc.ChainStreamInterceptor(calls.stream),
	)
	if opts.Runtime != nil {
		runtimeapi.RegisterRuntimeServiceServer(g, opts.Runtime)
	}
	if opts.Images != nil {
		runtimeapi.RegisterImageServiceServer(g, opts.Images)
	}
	if opts.Extension != nil {
		RegisterExtensionServer(g, opts.Extension)
	}
	return &Server{socket: opts.Socket, log: log, grpc: g}
}

// Listen claims the socket: it refuses to start if a live server answers on
// it, replaces a stale one left by a crash, and restricts it to root (0660)
// from the moment it has its name.
func (s *Server) Listen() error {
	if err := s.clearStale(); err != nil {
		return err
	}
	// A folder made for the socket is root's alone, as berthd's state is.
	if err := os.MkdirAll(filepath.Dir(s.socket), 0o700); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	ln, err := listenRootOnly(s.socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.socket, err)
	}
	s.ln = ln
	return nil
}

// listenRootOnly binds a unix socket that is root's and 0660 whenever path
// names it. A socket is made with the mode the umask leaves, so it is bound
// in a private (0700) folder beside path, given its mode and owner there,
// then renamed into place: the rename keeps the bound socket, is atomic, and
// with RENAME_NOREPLACE cannot replace a socket another berthd made since
// clearStale. Not a umask around the bind: the umask is process-wide, and
// by now other goroutines of berthd (shim followers, pulls, the stream
// server) create files.
func listenRootOnly(path string) (net.Listener, error) {
	dir := bindDir(filepath.Dir(path), os.Getpid())
	removeBindDir(dir) // left by a berthd that had this pid before and crashed here
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	defer removeBindDir(dir)
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	// Named through the folder's descriptor: short whatever the folder's
	// path, so a socket path that fits sun_path (107 bytes) binds even
	// though the bind folder lengthens it.
	private := fmt.Sprintf("/proc/self/fd/%d/s", d.Fd())
	ln, err := net.Listen("unix", private)
	if err != nil {
		return nil, err
	}
	// The listener would remove only its bind name at close; Shutdown
	// removes the socket by its real name.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := rootOnly(private); err != nil {
		ln.Close()
		return nil, err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, private, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		ln.Close()
		return nil, fmt.Errorf("move the socket into place: %w", err)
	}
	return ln, nil
}

// bindDirPrefix names the private folders listenRootOnly binds in; the
// pid of the berthd that made one follows it.
const bindDirPrefix = ".berth-bind."

func bindDir(socketDir string, pid int) string {
	return filepath.Join(socketDir, bindDirPrefix+strconv.Itoa(pid))
}

// removeDeadBindDirs removes the bind folders beside the socket that a
// berthd which crashed in listenRootOnly left. A folder whose berthd still
// runs is another berthd binding now; it is left to that one. Only the
// bound socket and the folder go: anything else in it is not berth's.
func removeDeadBindDirs(socketDir string) {
	found, _ := filepath.Glob(filepath.Join(socketDir, bindDirPrefix+"*"))
	for _, dir := range found {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), bindDirPrefix))
		if err != nil || pid <= 0 || unix.Kill(pid, 0) != unix.ESRCH {
			continue
		}
		removeBindDir(dir)
	}
}

// removeBindDir removes a bind folder: its socket, then the folder, which
// stays if something else is in it.
func removeBindDir(dir string) {
	os.Remove(filepath.Join(dir, "s"))
	os.Remove(dir)
}

// rootOnly makes the socket at path 0660 and root's. Unprivileged (unit
// tests) it cannot chown, and the file is its own anyway.
func rootOnly(path string) error {
	if err := os.Chmod(path, 0o660); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		return os.Chown(path, 0, 0)
	}
	return nil
}

// clearStale removes what a berthd that crashed left: its bind folders and,
// unless a server answers on it, its socket.
func (s *Server) clearStale() error {
	removeDeadBindDirs(filepath.Dir(s.socket))
	fi, err := os.Lstat(s.socket)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", s.socket, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("socket %s is a directory", s.socket)
	}
	if fi.Mode()&fs.ModeSocket != 0 {
		conn, err := net.DialTimeout("unix", s.socket, time.Second)
		if err == nil {
			conn.Close()
			return fmt.Errorf("another berthd is serving on %s", s.socket)
		}
		// Only "refused" proves nobody listens; a timeout or EAGAIN (full
		// backlog) means someone does but is busy.
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("socket %s exists and may be in use: %w", s.socket, err)
		}
	}
	s.log.Warn("removing stale socket", "path", s.socket, "mode", fi.Mode().String())
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// Serve answers calls until Shutdown; it returns nil after a shutdown.
func (s *Server) Serve() error {
	if s.ln == nil {
		return errors.New("cri: Serve before Listen")
	}
	err := s.grpc.Serve(s.ln)
	if errors.Is(err, grpc.ErrServerStopped) { // Shutdown won the race with Serve
		return nil
	}
	return err
}

// Shutdown lets calls in flight finish for up to timeout, then cuts the rest
// (a kubelet's event stream never ends on its own) and removes the socket.
func (s *Server) Shutdown(timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		s.log.Warn("calls still running after graceful stop timeout, closing them", "timeout", timeout)
		s.grpc.Stop()
		<-done
	}
	if s.ln != nil {
		if err := os.Remove(s.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("remove socket", "path", s.socket, "err", err)
		}
	}
}

// callObserver logs and counts every call.
type callObserver struct {
	log     *callLog
	metrics *requestMetrics
	// describe names the pod and container a failed call was about; nil:
	// only what the request itself carries.
	describe func(req any) []any
}

// callDescriber is a service that can name the objects of its requests.
type callDescriber interface {
	describeCall(req any) []any
}

func (o *callObserver) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	ctx, span := startCallSpan(ctx, info.FullMethod)
	resp, err := h(ctx, req)
	endCallSpan(span, err)
	o.record(ctx, info.FullMethod, req, start, err)
	return resp, err
}

func (o *callObserver) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	ctx, span := startCallSpan(ss.Context(), info.FullMethod)
	err := h(srv, &tracedStream{ServerStream: ss, ctx: ctx})
	endCallSpan(span, err)
	o.record(ss.Context(), info.FullMethod, nil, start, err)
	return err
}

// tracedStream hands the handler the context that carries the call's span.
type tracedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedStream) Context() context.Context { return s.ctx }

func (o *callObserver) record(ctx context.Context, method string, req any, start time.Time, err error) {
	o.metrics.observe(method, start, err)
	var subject []any
	if err != nil && req != nil {
		subject = requestSubject(req)
		if o.describe != nil {
			subject = append(subject, o.describe(req)...)
		}
	}
	o.log.record(ctx, method, start, err, subject...)
}

// warnEvery is how often one method's Unimplemented or Internal answers
// about one pod or container are logged at warn: the kubelet repeats such
// calls every few seconds.
const warnEvery = time.Minute

// callLog logs every call at debug and failures higher: the caller's
// mistakes (NotFound, InvalidArgument, …) at info, calls berth does not have
// and its own failures at warn, at most once per warnEvery per method, code
// and subject (another pod's failure gets its own line), with the count of
// those left out in between.
type callLog struct {
	log *slog.Logger

	mu     sync.Mutex
	warned map[string]*warnWindow // method, code and subject
}

type warnWindow struct {
	at         time.Time
	suppressed int
}

func newCallLog(log *slog.Logger) *callLog {
	return &callLog{log: log, warned: map[string]*warnWindow{}}
}

// record logs one call; subject is what a failed call was about (pod and
// container IDs and names), as slog key-value pairs.
func (c *callLog) record(ctx context.Context, method string, start time.Time, err error, subject ...any) {
	st := status.Convert(err)
	attrs := append([]any{"method", method, "duration", time.Since(start), "code", st.Code().String()}, subject...)
	level := slog.LevelDebug
	switch st.Code() {
	case codes.OK:
	case codes.Canceled:
		// The kubelet cancels calls routinely: no news for an operator.
		attrs = append(attrs, "err", st.Message())
	case codes.Unimplemented, codes.Internal, codes.Unknown, codes.DataLoss, codes.Unavailable, codes.ResourceExhausted:
		suppressed, ok := c.mayWarn(fmt.Sprintf("%s %s %q", method, st.Code(), subject))
		if ok {
			level = slog.LevelWarn
		}
		attrs = append(attrs, "err", st.Message())
		if suppressed > 0 {
			attrs = append(attrs, "suppressed", suppressed)
		}
	default:
		level = slog.LevelInfo
		attrs = append(attrs, "err", st.Message())
	}
	c.log.Log(ctx, level, "cri call", attrs...)
}

// mayWarn reports whether key may be logged at warn now, and how many of its
// warnings were held back since the last one.
func (c *callLog) mayWarn(key string) (suppressed int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.warned[key]
	now := time.Now()
	if w != nil && now.Sub(w.at) < warnEvery {
		w.suppressed++
		return 0, false
	}
	if w == nil {
		// Windows that passed are forgotten (the lines they held back went
		// out at debug), or every pod that ever failed would stay here.
		for k, old := range c.warned {
			if now.Sub(old.at) >= warnEvery {
				delete(c.warned, k)
			}
		}
		w = &warnWindow{}
		c.warned[key] = w
	}
	suppressed, w.at, w.suppressed = w.suppressed, now, 0
	return suppressed, true
}
