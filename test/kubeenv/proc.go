package kubeenv

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Proc is a daemon a test started; it is only ever signalled by its PID.
type Proc struct {
	Name string
	Log  string // its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs argv with its output appended to logPath.
func Start(t *testing.T, name, logPath string, argv ...string) *Proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A daemon must not outlive a test binary that crashed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p
}

func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends sig and waits up to timeout, then SIGKILLs. It reports whether
// the process exited from sig within timeout (a nil or exited one did).
func (p *Proc) Stop(sig syscall.Signal, timeout time.Duration) bool {
	if p == nil || !p.Running() {
		return true
	}
	_ = syscall.Kill(p.PID(), sig)
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		_ = syscall.Kill(p.PID(), syscall.SIGKILL)
		<-p.done
		return false
	}
}

// Tail is the end of the process's log, for failure messages, without
// berthd's debug lines of successful CRI calls (the kubelet polls often).
func (p *Proc) Tail(lines int) string {
	b, _ := os.ReadFile(p.Log)
	all := slices.DeleteFunc(strings.Split(strings.TrimRight(string(b), "\n"), "\n"), func(l string) bool {
		return strings.Contains(l, `level=DEBUG msg="cri call"`) && strings.HasSuffix(l, "code=OK")
	})
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// WaitUp polls ready until it holds, failing t when p exits or after timeout.
func (p *Proc) WaitUp(t *testing.T, timeout time.Duration, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if !p.Running() {
			t.Fatalf("%s exited during start:\n%s", p.Name, p.Tail(60))
		}
		err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within %s: %v\n%s", p.Name, timeout, err, p.Tail(60))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// LiveProcessesWithArg returns the PIDs of live processes, this one
// excepted, with an argument containing substr.
func LiveProcessesWithArg(substr string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(substr)) {
			continue
		}
		// The state follows the parenthesised command name; zombies hold nothing.
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if i := bytes.LastIndexByte(stat, ')'); err != nil || i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		if pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Cmdline is the command line of pid, its arguments joined by spaces.
func Cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// FreePort returns a loopback TCP port nothing listens on right now.
func FreePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// httpClient opens a connection per request: a Service's load balancing
// picks a replica per connection, and a kept-alive one would always reach
// the same.
var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Get returns the body of a 200 answer.
func Get(url string) (string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return b.String(), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b.String(), err
}

// Healthz is nil when the loopback port answers "ok" on /healthz, as the
// kubelet does once it is up.
func Healthz(port int) error {
	body, err := Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
	if err == nil && body != "ok" {
		err = fmt.Errorf("healthz %q", body)
	}
	return err
}
