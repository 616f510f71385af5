package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stopTimeout is from SIGTERM to exit.
const stopTimeout = 15 * time.Second

// startTimeout is until the socket answers Version. A race-built berthd on
// a loaded host has taken over 10 s. In the VM tier (BERTH_VM=1: two
// emulated CPUs, which the host's cluster tier beside it starves) one took
// 23 s from its first log line to serving on 2026-11-27.
var startTimeout = func() time.Duration {
	if os.Getenv("BERTH_VM") == "1" {
		return 90 * time.Second
	}
	return 30 * time.Second
}()

// binaries are built once per test binary by Main.
var binaries struct {
	dir string
}

// BinDirEnv names a folder of prebuilt berthd, berthctl, berth-shim,
// berth-shim-helper, berth-pause and berth-exec-init that
// Main uses instead of building them: the VM tier (test/vm) runs the test
// binaries where there is no Go toolchain.
const BinDirEnv = "BERTH_BIN_DIR"

// Main is the TestMain of packages that run berthd. When the environment
// variable env is "1" (BERTH_INTEGRATION, BERTH_BENCH) and the process is root,
// it builds ./cmd/berthd and ./cmd/berthctl once (with -race when BERTH_RACE=1)
// into a temp folder before running the tests; a build failure ends the run.
// With BERTH_BIN_DIR set it builds nothing and runs the binaries found there.
func Main(m *testing.M, env string) {
	os.Exit(runMain(m, env))
}

func runMain(m *testing.M, env string) int {
	if os.Getenv(env) == "1" && os.Geteuid() == 0 {
		if dir := os.Getenv(BinDirEnv); dir != "" {
			for _, name := range []string{"berthd", "berthctl", "berth-shim", "berth-shim-helper", "berth-pause", "berth-exec-init"} {
				if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
					fmt.Fprintf(os.Stderr, "harness: %s: %v\n", BinDirEnv, err)
					return 1
				}
			}
			binaries.dir = dir
			return m.Run()
		}
		dir, err := buildBinaries(env == "BERTH_INTEGRATION")
		if err != nil {
			fmt.Fprintf(os.Stderr, "harness: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		binaries.dir = dir
	}
	return m.Run()
}

// RequireEnv skips t unless env is "1"; with it set, t fails unless run as root.
func RequireEnv(t testing.TB, env string) {
	t.Helper()
	if os.Getenv(env) != "1" {
		t.Skipf("set %s=1 (root) to run", env)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s=1 needs root (euid is %d)", env, os.Geteuid())
	}
}

// RequireIntegration is RequireEnv(t, "BERTH_INTEGRATION").
func RequireIntegration(t testing.TB) {
	t.Helper()
	RequireEnv(t, "BERTH_INTEGRATION")
}

// goTool is the go command on PATH, else the usual install location.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// ModuleRoot is the folder of berth's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command(goTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside berth's Go module")
	}
	return filepath.Dir(gomod), nil
}

// ShimBuildTags are the build tags of berth-shim-helper: the Makefile's,
// and what every test that builds its own helper uses (seccomp links
// libcontainer's seccomp support with libseccomp).
const ShimBuildTags = "netgo,osusergo,seccomp"

// buildBinaries builds berthd, berthctl, berth-shim and berth-shim-helper
// into a temp folder;
// crashpoints builds berthd with its crash points (cri/crashpoint), which
// the integration tests drive and benchmarks must not pay for.
func buildBinaries(crashpoints bool) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "berth-bin-")
	if err != nil {
		return "", err
	}
	args := []string{"build", "-o", dir + "/"}
	if os.Getenv("BERTH_RACE") == "1" {
		args = append(args, "-race")
	}
	if crashpoints {
		args = append(args, "-tags", "crashpoints")
	}
	args = append(args, "./cmd/berthd", "./cmd/berthctl")
	// The shim and its helper are linked statically, the helper with
	// libseccomp, as the Makefile builds them (and without -race, which
	// static cgo binaries do not support), with the Makefile's -trimpath, so
	// that their packages compile once per make test. (The shim has no C:
	// with cgo enabled, its net package would still link statically through
	// -extldflags -static.)
	shimArgs := []string{"build", "-trimpath", "-o", dir + "/", "-tags", ShimBuildTags, "-ldflags", "-extldflags -static", "./cmd/berth-shim", "./cmd/berth-shim-helper"}
	for _, a := range [][]string{args, shimArgs} {
		cmd := exec.Command(goTool(), a...)
		cmd.Dir = root
		// -race and the shim's libseccomp both need cgo.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("go %s: %v\n%s", strings.Join(a, " "), err, out)
		}
	}
	if err := BuildC(root, dir); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// BuildC builds berth's C programs (berth-pause, berth-exec-init) into dir
// with the Makefile's rule, from the module root.
func BuildC(root, dir string) error {
	cmd := exec.Command("make", "--no-print-directory", "BIN="+dir, "cbins")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make cbins: %v\n%s", err, out)
	}
	return nil
}

// BinaryPath is the path of a binary Main built ("berthd", "berthctl").
func BinaryPath(t testing.TB, name string) string {
	t.Helper()
	if binaries.dir == "" {
		t.Fatal("berthd was not built: call harness.Main from TestMain, with the guard variable set, as root")
	}
	return filepath.Join(binaries.dir, name)
}

// Options configures StartDaemon.
type Options struct {
	// ConfigTOML is written to a temp file passed as --config.
	ConfigTOML string
	// Root, State and Socket replace the fresh temp folders (and State/berth.sock).
	Root, State, Socket string
	// Args are extra berthd flags.
	Args []string
	// Env is added to berthd's environment ("BERTH_CRASHPOINT=...").
	Env []string
}

// Daemon is a berthd started by StartDaemon.
type Daemon struct {
	t    testing.TB
	args []string
	env  []string

	// Root, State, Socket and Config are what berthd was started with.
	Root, State, Socket, Config string
	// Runtime and Images are CRI clients on Socket (replaced by Restart).
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient

	logs *SyncBuffer
	conn *grpc.ClientConn

	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has exited
	state *os.ProcessState
}

// SyncBuffer is an output sink several goroutines write to and tests read.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newDaemon lays out the folders and config file of a berthd, without starting it.
func newDaemon(t testing.TB, o Options) *Daemon {
	t.Helper()
	d := &Daemon{t: t, Root: o.Root, State: o.State, Socket: o.Socket, env: o.Env, logs: &SyncBuffer{}}
	if d.Root == "" {
		d.Root = t.TempDir()
	}
	if d.State == "" {
		// Short, so that the socket path stays far below the 107-byte limit.
		dir, err := os.MkdirTemp("", "berth-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// berthd leaves STATE/pods a private bind mount of itself on
			// purpose (sandbox/podns.PrepareRoot); left mounted, every test's
			// would lengthen the node's mountinfo, which each Go process start
			// and each container init parses.
			syscall.Unmount(filepath.Join(dir, "pods"), syscall.MNT_DETACH)
			os.RemoveAll(dir)
		})
		d.State = dir
	}
	if d.Socket == "" {
		d.Socket = filepath.Join(d.State, "berth.sock")
	}
	d.Config = filepath.Join(t.TempDir(), "config.toml")
	config := o.ConfigTOML
	if !strings.Contains(config, "[network]") {
		config += testNetworkTOML(t)
	}
	if err := os.WriteFile(d.Config, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	d.args = append([]string{"--config", d.Config, "--root", d.Root, "--state", d.State,
		"--socket", d.Socket, "--log-level", "debug"}, o.Args...)
	return d
}

// StartDaemon starts berthd on fresh temp folders and waits (up to 10 s) until its
// socket answers CRI Version. On cleanup it is stopped with Stop (SIGTERM, clean
// exit, socket removed); its output is logged when the test failed.
func StartDaemon(t testing.TB, o Options) *Daemon {
	t.Helper()
	d := newDaemon(t, o)
	t.Cleanup(func() {
		if d.Running() {
			d.Stop()
		}
		if t.Failed() {
			t.Logf("berthd output (%s):\n%s", d.Root, d.Logs())
			if b, err := os.ReadFile(filepath.Join(d.State, "lazyd", "lazyd.log")); err == nil {
				t.Logf("lazy layer server output:\n%s", b)
			}
		}
		// The lazy layer server outlives berthd on purpose; a test that
		// left lazy layers leaves it serving them.
		if len(d.LazyServerPIDs()) > 0 {
			d.KillLazyServer()
			d.detachLazyMounts()
		}
	})
	d.start()
	return d
}

// RunDaemonUntilExit starts berthd expecting it to refuse to run: it must exit on
// its own within 10 s (else it is killed and t fails). It returns the exit code
// and berthd's output.
func RunDaemonUntilExit(t testing.TB, o Options) (int, string) {
	t.Helper()
	d := newDaemon(t, o)
	d.spawn()
	select {
	case <-d.done:
	case <-time.After(startTimeout):
		_ = d.signal(syscall.SIGKILL)
		<-d.done
		t.Fatalf("berthd did not exit within %s; output:\n%s", startTimeout, d.Logs())
	}
	return d.exitCode(), d.Logs()
}

func (d *Daemon) spawn() {
	d.t.Helper()
	cmd := exec.Command(BinaryPath(d.t, "berthd"), d.args...)
	cmd.Stdout, cmd.Stderr = d.logs, d.logs
	cmd.Env = append(os.Environ(), d.env...)
	// berthd must not outlive a crashed test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		d.t.Fatalf("start berthd: %v", err)
	}
	done := make(chan struct{})
	d.mu.Lock()
	d.cmd, d.done, d.state = cmd, done, nil
	d.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		d.mu.Lock()
		d.state = cmd.ProcessState
		d.mu.Unlock()
		close(done)
	}()
}

func (d *Daemon) start() {
	d.t.Helper()
	d.spawn()
	// A short reconnect backoff: the first dials race berthd's listen, and
	// grpc's default would make every start (and restart) wait a second.
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		d.t.Fatalf("grpc client for %s: %v", d.Socket, err)
	}
	d.conn = conn
	d.Runtime = runtimeapi.NewRuntimeServiceClient(conn)
	d.Images = runtimeapi.NewImageServiceClient(conn)
	deadline := time.Now().Add(startTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			d.t.Fatalf("berthd exited during start (%v); output:\n%s", d.exitState(), d.Logs())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, lastErr = d.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
		cancel()
		if lastErr == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.t.Fatalf("berthd socket %s did not answer Version within %s: %v", d.Socket, startTimeout, lastErr)
}

// PID is berthd's process ID.
func (d *Daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd.Process.Pid
}

// Running reports whether berthd has not exited yet.
func (d *Daemon) Running() bool {
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Done is closed when the current berthd process has exited.
func (d *Daemon) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

func (d *Daemon) signal(sig syscall.Signal) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd.Process.Signal(sig)
}

func (d *Daemon) exitState() *os.ProcessState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state
}

func (d *Daemon) exitCode() int {
	if st := d.exitState(); st != nil {
		return st.ExitCode()
	}
	return -1
}

// Logs is everything berthd wrote to stdout and stderr so far.
func (d *Daemon) Logs() string { return d.logs.String() }

// Signal sends sig to berthd without waiting.
func (d *Daemon) Signal(sig syscall.Signal) {
	d.t.Helper()
	if err := d.signal(sig); err != nil {
		d.t.Fatalf("signal berthd: %v", err)
	}
}

// Stop sends SIGTERM and waits up to 15 s for berthd to exit, then asserts that
// it exited with code 0 and removed its socket.
func (d *Daemon) Stop() {
	d.t.Helper()
	if !d.Running() {
		return
	}
	d.Signal(syscall.SIGTERM)
	select {
	case <-d.Done():
	case <-time.After(stopTimeout):
		_ = d.signal(syscall.SIGKILL)
		<-d.Done()
		d.closeConn()
		d.t.Fatalf("berthd did not exit within %s of SIGTERM (killed)", stopTimeout)
	}
	d.closeConn()
	if code := d.exitCode(); code != 0 {
		d.t.Errorf("berthd exited with %v after SIGTERM, want exit code 0", d.exitState())
	}
	if _, err := os.Lstat(d.Socket); !errors.Is(err, fs.ErrNotExist) {
		d.t.Errorf("socket %s still exists after berthd exited (stat: %v)", d.Socket, err)
	}
}

// WaitExit waits up to timeout for berthd to exit on its own (after a signal the
// test sent) and returns its exit code, -1 when a signal killed it. It kills
// berthd and fails t when it is still running after timeout.
func (d *Daemon) WaitExit(timeout time.Duration) int {
	d.t.Helper()
	select {
	case <-d.Done():
	case <-time.After(timeout):
		_ = d.signal(syscall.SIGKILL)
		<-d.Done()
		d.closeConn()
		d.t.Fatalf("berthd did not exit within %s (killed)", timeout)
	}
	d.closeConn()
	return d.exitCode()
}

// Kill sends SIGKILL and waits for berthd to die (nothing is cleaned up).
func (d *Daemon) Kill() {
	d.t.Helper()
	if !d.Running() {
		return
	}
	d.Signal(syscall.SIGKILL)
	select {
	case <-d.Done():
	case <-time.After(stopTimeout):
		d.t.Fatalf("berthd survived SIGKILL for %s", stopTimeout)
	}
	d.closeConn()
}

// Restart stops berthd (Stop) if it runs, then starts it again on the same
// folders and config and waits for its socket; Runtime and Images are replaced.
func (d *Daemon) Restart() {
	d.t.Helper()
	d.Stop()
	d.start()
}

// RestartEnv is Restart with env, from now on, as the extra environment
// instead of Options.Env.
func (d *Daemon) RestartEnv(env ...string) {
	d.t.Helper()
	d.Stop()
	d.env = env
	d.start()
}

func (d *Daemon) closeConn() {
	if d.conn != nil {
		_ = d.conn.Close()
		d.conn = nil
	}
}

// Berthctl runs `berthctl --socket SOCKET args...` (for up to 2 minutes) and
// returns its stdout; the error carries its stderr.
func (d *Daemon) Berthctl(args ...string) (string, error) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, BinaryPath(d.t, "berthctl"), append([]string{"--socket", d.Socket}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("berthctl %s: %w; stderr: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}
