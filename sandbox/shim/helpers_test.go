package shim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// pod is one shim serving a temp pod folder.
type pod struct {
	t   *testing.T
	dir string
	c   *shim.Client
	pid int
	ids []string
	cg  string // cgroup name prefix, unique per pod
}

var pods atomic.Int32

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newPod(t *testing.T) *pod {
	t.Helper()
	needRoot(t)
	p := &pod{t: t, dir: t.TempDir(), cg: fmt.Sprintf("p%d-", pods.Add(1))}
	p.start()
	t.Cleanup(p.cleanup)
	return p
}

func (p *pod) start() {
	t := p.t
	t.Helper()
	c, err := shim.Start(ctxT(t), shimBin, p.dir)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	p.c, p.pid = c, info.Pid
}

// cleanup kills what the test left, removes the containers and ends the
// shim, checking that no container cgroup is left.
func (p *pod) cleanup() {
	ctx := ctxT(p.t)
	if _, err := p.c.Info(ctx); errors.Is(err, shim.ErrUnavailable) {
		p.start() // the test killed it
	}
	for _, id := range p.ids {
		if err := p.c.Kill(ctx, id, syscall.SIGKILL, true); err != nil && !shim.IsNotFound(err) {
			p.t.Logf("cleanup kill %s: %v", id, err)
		}
		if st, err := p.c.State(ctx, id); err == nil && st.Status != shim.StatusStopped && st.Pid > 0 {
			waitGone(p.t, st.Pid) // a leftover is not the shim's child: poll
		}
		p.c.Wait(ctx, id)
		if err := p.c.Delete(ctx, id); err != nil && !shim.IsNotFound(err) {
			p.t.Errorf("cleanup delete %s: %v", id, err)
		}
	}
	if err := p.c.Shutdown(ctx); err != nil {
		p.t.Errorf("shutdown: %v", err)
	}
	p.c.Close()
	if !waitGone(p.t, p.pid) {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), p.dir) || strings.Contains(string(b), rootfs) {
		p.t.Errorf("mount left on the host:\n%s", b)
	}
	if b, _ := os.ReadFile(filepath.Join(p.dir, shim.LogFile)); strings.Contains(string(b), "DATA RACE") {
		p.t.Errorf("race in the shim:\n%s", b)
	}
	for _, id := range p.ids {
		for _, cg := range leftCgroups() {
			if strings.HasSuffix(cg, ":"+p.cg+id) {
				p.t.Errorf("cgroup left: %s", cg)
			}
		}
	}
}

type specOpt func(*specs.Spec)

// withPIDNamespace joins the PID namespace at path ("" for a new one).
func withPIDNamespace(path string) specOpt {
	return func(s *specs.Spec) {
		for i, ns := range s.Linux.Namespaces {
			if ns.Type == specs.PIDNamespace {
				s.Linux.Namespaces[i].Path = path
			}
		}
	}
}

// writeSpec writes containers/<id>/config.json: busybox rootfs, new
// mount/pid/ipc/uts/net namespaces, a test cgroup.
func (p *pod) writeSpec(id string, args []string, opts ...specOpt) {
	p.t.Helper()
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID",
		"CAP_SETUID", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_SYS_RESOURCE"}
	oom := -100 // lower than the shim's: needs CAP_SYS_RESOURCE, which this host may lack
	spec := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: rootfs},
		Hostname: "shimtest",
		Process: &specs.Process{
			Args: args,
			Env:  []string{"PATH=/bin", "HOME=/"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits:     []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			OOMScoreAdj: &oom,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
			},
			CgroupsPath:   cgroupParent + "/" + p.cg + id,
			MaskedPaths:   []string{"/proc/kcore"},
			ReadonlyPaths: []string{"/proc/sys"},
		},
	}
	for _, o := range opts {
		o(spec)
	}
	dir := shim.ContainerDir(p.dir, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		p.t.Fatal(err)
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, shim.ConfigFile), b, 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// run creates and starts a container; the log goes to <pod>/<id>.log.
func (p *pod) run(id string, args []string, opts ...specOpt) shim.State {
	p.t.Helper()
	p.create(shim.CreateRequest{ID: id}, args, opts...)
	st, err := p.c.Start(ctxT(p.t), id)
	if err != nil {
		p.t.Fatal(err)
	}
	return st
}

func (p *pod) create(req shim.CreateRequest, args []string, opts ...specOpt) {
	p.t.Helper()
	p.writeSpec(req.ID, args, opts...)
	if req.LogPath == "" {
		req.LogPath = p.logPath(req.ID)
	}
	p.ids = append(p.ids, req.ID)
	if err := p.c.Create(ctxT(p.t), req); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pod) logPath(id string) string { return filepath.Join(p.dir, id+".log") }

func (p *pod) wait(id string) shim.State {
	p.t.Helper()
	st, err := p.c.Wait(ctxT(p.t), id)
	if err != nil {
		p.t.Fatal(err)
	}
	return st
}

type record struct{ stream, tag, content string }

func readLog(t *testing.T, path string) []record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []record
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		f := strings.SplitN(strings.TrimSuffix(line, "\n"), " ", 4)
		if len(f) != 4 || !strings.HasSuffix(line, "\n") {
			t.Fatalf("malformed log line %q", line)
		}
		if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
			t.Fatalf("log timestamp: %v", err)
		}
		out = append(out, record{f[1], f[2], f[3]})
	}
	return out
}

// eventually polls cond for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X'
}

// waitGone polls until pid is gone (or a zombie); false after 10s.
func waitGone(t *testing.T, pid int) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !alive(pid) {
			return true
		}
	}
	t.Logf("pid %d still alive", pid)
	return false
}

// procsWithArg lists live processes whose argv contains arg.
func procsWithArg(arg string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(b), "\x00") {
			if a == arg && alive(pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// status reads a field ("VmRSS") of /proc/<pid>/status.
func status(pid int, field string) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
