package shim_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

func TestRunLogsAndExit(t *testing.T) {
	p := newPod(t)
	p.run("echo", []string{"sh", "-c", "echo out; echo err >&2; exit 3"})
	st := p.wait("echo")
	if st.Status != shim.StatusStopped || st.ExitCode != 3 || st.Signal != 0 || st.FinishedAt.IsZero() || st.StartedAt.IsZero() {
		t.Fatalf("state %+v", st)
	}
	started, ex, err := shim.ReadRecords(shim.ContainerDir(p.dir, "echo"))
	if err != nil || started == nil || ex == nil {
		t.Fatalf("records %v %v %v", started, ex, err)
	}
	if ex.ExitCode != 3 || !ex.FinishedAt.Equal(st.FinishedAt) || started.Pid != st.Pid {
		t.Fatalf("exit record %+v, start record %+v", ex, started)
	}
	got := readLog(t, p.logPath("echo"))
	want := map[record]bool{{"stdout", "F", "out"}: true, {"stderr", "F", "err"}: true}
	if len(got) != 2 || !want[got[0]] || !want[got[1]] {
		t.Fatalf("log %v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(p.dir, shim.LogFile)); len(b) > 0 {
		t.Logf("shim.log:\n%s", b)
	}
}

// The shim is detached: its own session (a signal to the caller's process
// group leaves it running), one process start (the caller's child, not an
// intermediate's), and it serves only a root-only socket.
func TestStartDetached(t *testing.T) {
	p := newPod(t)
	if ppid, _ := strconv.Atoi(strings.Fields(status(p.pid, "PPid"))[0]); ppid != os.Getpid() {
		t.Fatalf("shim %d is a child of %d, want the test process (%d): started through an intermediate", p.pid, ppid, os.Getpid())
	}
	if sid, _ := unix.Getsid(p.pid); sid != p.pid {
		t.Fatalf("shim session %d, want its own (%d)", sid, p.pid)
	}
	fi, err := os.Stat(shim.SocketPath(p.dir))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi.Mode(), err)
	}
	if b, _ := os.ReadFile(filepath.Join(p.dir, shim.PidFile)); strings.TrimSpace(string(b)) != strconv.Itoa(p.pid) {
		t.Fatalf("shim.pid %q, want %d", b, p.pid)
	}
	// Starting again reuses the running shim.
	c, err := shim.Start(ctxT(t), shimBin, p.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info, err := c.Info(ctxT(t)); err != nil || info.Pid != p.pid {
		t.Fatalf("second Start: %+v %v", info, err)
	}
}

// TestStartTimeoutKillsShim: a shim that does not get ready in time is
// killed, not left to come up later serving a folder its caller gave up on.
func TestStartTimeoutKillsShim(t *testing.T) {
	dir := t.TempDir()
	slow := filepath.Join(dir, "slow-shim")
	// Takes the shim's arguments and never reports ready.
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nexec sleep 987655\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Start hands every shim the berth-exec-init beside it.
	b, err := os.ReadFile(filepath.Join(filepath.Dir(shimBin), shim.ExecInitBinary))
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, shim.ExecInitBinary), b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	if _, err := shim.Start(ctx, slow, filepath.Join(dir, "pod")); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("Start of a shim that never gets ready: %v", err)
	}
	eventually(t, "the slow shim killed", func() bool { return len(procsWithArg("987655")) == 0 })
}

func TestCreatedThenStarted(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.create(shim.CreateRequest{ID: "c"}, []string{"sleep", "1000"})
	st, err := p.c.State(ctx, "c")
	if err != nil || st.Status != shim.StatusCreated || st.Pid <= 0 || !alive(st.Pid) {
		t.Fatalf("after Create: %+v %v", st, err)
	}
	if _, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"true"}}); !errors.Is(err, shim.ErrNotRunning) {
		t.Fatalf("exec in a created container: %v", err)
	}
	if st, err = p.c.Start(ctx, "c"); err != nil || st.Status != shim.StatusRunning || st.StartedAt.IsZero() {
		t.Fatalf("Start: %+v %v", st, err)
	}
	if _, err := p.c.Start(ctx, "c"); !errors.Is(err, shim.ErrNotCreated) {
		t.Fatalf("second Start: %v", err)
	}
	if err := p.c.Delete(ctx, "c"); !errors.Is(err, shim.ErrNotStopped) {
		t.Fatalf("Delete of a running container: %v", err)
	}
	if err := p.c.Create(ctx, shim.CreateRequest{ID: "c"}); !errors.Is(err, shim.ErrExists) {
		t.Fatalf("duplicate Create: %v", err)
	}
	if _, err := p.c.State(ctx, "nope"); !shim.IsNotFound(err) {
		t.Fatalf("State of unknown: %v", err)
	}
	// A PID 1 without a handler ignores SIGTERM; SIGKILL ends it: 137.
	if err := p.c.Kill(ctx, "c", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if st := p.wait("c"); st.ExitCode != 137 || st.Signal != 9 {
		t.Fatalf("after SIGKILL: %+v", st)
	}
	if err := p.c.Kill(ctx, "c", syscall.SIGKILL, false); err != nil {
		t.Fatalf("Kill of a stopped container: %v", err)
	}
}

// Killing a created container (never started) records its exit too.
func TestKillCreated(t *testing.T) {
	p := newPod(t)
	p.create(shim.CreateRequest{ID: "c"}, []string{"sleep", "1000"})
	if err := p.c.Kill(ctxT(t), "c", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if st := p.wait("c"); st.ExitCode != 137 || !st.StartedAt.IsZero() {
		t.Fatalf("state %+v", st)
	}
	if _, err := p.c.Start(ctxT(t), "c"); !errors.Is(err, shim.ErrNotCreated) {
		t.Fatalf("Start after kill: %v", err)
	}
}

// A pod sharing one PID namespace: the built-in pause is its PID 1, so a
// container's process is not, and SIGTERM ends it (143). Orphans land on
// pause, which reaps them. The pause ignores signals it can be sent (only
// SIGKILL from outside its namespace ends it).
func TestSharedPIDNamespace(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	pause := p.run("pause", []string{"/pause"})
	pidns := "/proc/" + strconv.Itoa(pause.Pid) + "/ns/pid"
	p.run("app", []string{"sh", "-c", "(sleep 0.2 &); exec sleep 1000"}, withPIDNamespace(pidns))
	time.Sleep(600 * time.Millisecond) // the orphaned sleep 0.2 has exited by now
	for _, k := range children(pause.Pid) {
		if !alive(k) {
			t.Errorf("zombie %d left under pause", k)
		}
	}
	if err := p.c.Kill(ctx, "app", syscall.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	if st := p.wait("app"); st.ExitCode != 143 || st.Signal != 15 {
		t.Fatalf("app after SIGTERM: %+v", st)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1} {
		if err := p.c.Kill(ctx, "pause", sig, false); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if st, err := p.c.State(ctx, "pause"); err != nil || st.Status != shim.StatusRunning {
		t.Fatalf("pause after SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1: %+v, %v", st, err)
	}
	if err := p.c.Kill(ctx, "pause", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if st := p.wait("pause"); st.Signal != 9 {
		t.Fatalf("pause after SIGKILL: %+v", st)
	}
}

// children lists the pids whose parent is pid.
func children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if k, err := strconv.Atoi(e.Name()); err == nil {
			if pp, _ := strconv.Atoi(status(k, "PPid")); pp == pid {
				out = append(out, k)
			}
		}
	}
	return out
}

func TestExec(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.run("c", []string{"sleep", "1000"})
	r, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"sh", "-c", "echo hi; echo oops >&2; exit 7"}})
	if err != nil || r.ExitCode != 7 || string(r.Stdout) != "hi\n" || string(r.Stderr) != "oops\n" || r.TimedOut {
		t.Fatalf("exec: %+v %v", r, err)
	}
	r, err = p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"id"}, User: &shim.User{UID: 1234, GID: 5678, AdditionalGids: []uint32{42}}})
	if err != nil || !strings.HasPrefix(string(r.Stdout), "uid=1234 gid=5678") || !strings.Contains(string(r.Stdout), "42") {
		t.Fatalf("exec as user: %q %v", r.Stdout, err)
	}
	r, err = p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"sh", "-c", "echo $FOO; pwd"}, Env: []string{"PATH=/bin", "FOO=bar"}, Cwd: "/tmp"})
	if err != nil || string(r.Stdout) != "bar\n/tmp\n" {
		t.Fatalf("exec env/cwd: %q %v", r.Stdout, err)
	}
	if _, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"/no/such/command"}}); err == nil {
		t.Fatal("exec of a missing command succeeded")
	}
	// As many variables as the kubelet gives a pod in a namespace of 500
	// Services (seven each).
	env := []string{"PATH=/bin"}
	for i := range 3500 {
		env = append(env, fmt.Sprintf("SVC_%d_PORT=tcp://10.0.0.1:80", i))
	}
	r, err = p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"sh", "-c", "env | grep -c ^SVC_"}, Env: env})
	if err != nil || string(r.Stdout) != "3500\n" {
		t.Fatalf("exec with 3500 variables: %q %q %v", r.Stdout, r.Stderr, err)
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.run("c", []string{"sleep", "1000"})
	start := time.Now()
	// The marker argv values find the processes afterwards: the shell and
	// a background child of it, which a kill of the shell alone would leave.
	r, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"sh", "-c", "sleep 987651 & sleep 987652; echo never"},
		Timeout: 300 * time.Millisecond})
	if err != nil || !r.TimedOut || len(r.Stdout) != 0 {
		t.Fatalf("exec: %+v %v", r, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timed-out exec took %v", d)
	}
	for _, marker := range []string{"987651", "987652"} {
		eventually(t, "no process with "+marker, func() bool { return len(procsWithArg(marker)) == 0 })
	}
}

// TestExecCallerGone: an exec without a timeout whose caller gives up is
// killed with what it started, not left running and buffering its output.
func TestExecCallerGone(t *testing.T) {
	p := newPod(t)
	p.run("c", []string{"sleep", "1000"})
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	_, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"sh", "-c", "sleep 987653 & yes marker-5c1d | sleep 987654"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec: %v, want the caller's deadline", err)
	}
	for _, marker := range []string{"987653", "987654", "marker-5c1d"} {
		eventually(t, "no process with "+marker, func() bool { return len(procsWithArg(marker)) == 0 })
	}
}

// TestExecOutputLimit checks that output past MaxOutput (stdout and stderr
// together) is dropped while the command runs on to its own exit code.
func TestExecOutputLimit(t *testing.T) {
	p := newPod(t)
	p.run("c", []string{"sleep", "1000"})
	script := "head -c 100000 /dev/zero; head -c 100000 /dev/zero >&2; exit 7"
	res, err := p.c.Exec(ctxT(t), shim.ExecRequest{ID: "c", Args: []string{"sh", "-c", script}, MaxOutput: 64 << 10})
	if err != nil || res.ExitCode != 7 || len(res.Stdout)+len(res.Stderr) != 64<<10 {
		t.Fatalf("exec: exit code %d, %d + %d bytes, %v; want 7 and %d bytes", res.ExitCode, len(res.Stdout), len(res.Stderr), err, 64<<10)
	}
}

func TestLongLineSplit(t *testing.T) {
	p := newPod(t)
	p.run("c", []string{"sh", "-c", "head -c 100000 /dev/zero | tr '\\000' a; echo; printf tail"})
	p.wait("c")
	got := readLog(t, p.logPath("c"))
	var line strings.Builder
	n := 0
	for _, r := range got {
		line.WriteString(r.content)
		n++
		if r.tag == "F" {
			break
		}
		if len(r.content) != 16<<10 {
			t.Fatalf("partial record of %d bytes", len(r.content))
		}
	}
	if line.String() != strings.Repeat("a", 100000) || n != 7 {
		t.Fatalf("line of %d bytes in %d records", line.Len(), n)
	}
	if last := got[len(got)-1]; len(got) != 8 || last != (record{"stdout", "P", "tail"}) {
		t.Fatalf("unterminated last line: %v", last)
	}
}

func TestReopenLog(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.run("c", []string{"sh", "-c", "echo one; until [ -e /tmp/go ]; do sleep 0.05; done; echo two; exec sleep 1000"})
	path := p.logPath("c")
	eventually(t, "first line", func() bool { b, _ := os.ReadFile(path); return len(b) > 0 })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := p.c.ReopenLog(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"touch", "/tmp/go"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "second line", func() bool { b, _ := os.ReadFile(path); return len(b) > 0 })
	if got := readLog(t, path+".1"); len(got) != 1 || got[0].content != "one" {
		t.Fatalf("rotated: %v", got)
	}
	if got := readLog(t, path); len(got) != 1 || got[0].content != "two" {
		t.Fatalf("reopened: %v", got)
	}
}

func TestTTY(t *testing.T) {
	p := newPod(t)
	p.create(shim.CreateRequest{ID: "c", TTY: true, Stdin: true}, []string{"sh", "-c", "echo tty-out; tty"})
	if _, err := p.c.Start(ctxT(t), "c"); err != nil {
		t.Fatal(err)
	}
	if st := p.wait("c"); st.ExitCode != 0 {
		t.Fatalf("state %+v", st)
	}
	got := readLog(t, p.logPath("c"))
	if len(got) != 2 || got[0] != (record{"stdout", "F", "tty-out"}) || !strings.HasPrefix(got[1].content, "/dev/pts/") {
		t.Fatalf("log %v", got)
	}
}

func TestShutdown(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.run("c", []string{"sleep", "1000"})
	if err := p.c.Shutdown(ctx); !errors.Is(err, shim.ErrBusy) {
		t.Fatalf("Shutdown with a running container: %v", err)
	}
	syscall.Kill(p.pid, syscall.SIGTERM) // ignored while busy
	p.c.Kill(ctx, "c", syscall.SIGKILL, false)
	p.wait("c")
	if err := p.c.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := p.c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !waitGone(t, p.pid) {
		t.Fatal("shim still running after Shutdown")
	}
	// The shim is the caller's child: Start's reaper waits for it, no
	// zombie is left.
	eventually(t, "the exited shim to be reaped (no zombie)", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(p.pid))
		return os.IsNotExist(err)
	})
	for _, f := range []string{shim.SocketFile, shim.PidFile} {
		if _, err := os.Stat(filepath.Join(p.dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s left after Shutdown", f)
		}
	}
	// The records outlive the shim; berthd reads them directly.
	st, err := shim.ReadRecordedState(shim.ContainerDir(p.dir, "c"))
	if err != nil || st.Status != shim.StatusStopped || st.ExitCode != 137 {
		t.Fatalf("recorded state %+v %v", st, err)
	}
	p.start() // for the cleanup
	p.ids = nil
}

// SIGKILL of the shim: its containers are not killed (their inits are
// reparented to the host's init), the records of exits it saw survive,
// berthd can read them without a shim, and a new shim for the pod reports,
// kills and removes the leftovers (but cannot learn their exit codes: they
// are not its children).
func TestShimKilled(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.run("quick", []string{"sh", "-c", "exit 5"})
	p.wait("quick")
	long := p.run("long", []string{"sleep", "1000"})
	if st, err := p.c.State(ctx, "long"); err != nil || st.Status != shim.StatusRunning || st.Pid != long.Pid {
		t.Fatalf("before: %+v %v", st, err)
	}
	if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, p.pid)
	if _, err := p.c.State(ctx, "long"); !errors.Is(err, shim.ErrUnavailable) {
		t.Fatalf("State through a dead shim: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if !alive(long.Pid) {
		t.Fatal("the container died with its shim")
	}
	if st, err := shim.ReadRecordedState(shim.ContainerDir(p.dir, "quick")); err != nil || st.ExitCode != 5 || st.Status != shim.StatusStopped {
		t.Fatalf("recorded quick: %+v %v", st, err)
	}
	if st, err := shim.ReadRecordedState(shim.ContainerDir(p.dir, "long")); err != nil || st.ExitCode != shim.UnknownExitCode || st.Status != shim.StatusStopped {
		t.Fatalf("recorded long: %+v %v", st, err)
	}

	p.c.Close()
	p.start() // a new shim on the same pod folder (stale socket and pid file)
	if st, err := p.c.State(ctx, "quick"); err != nil || st.ExitCode != 5 || st.Status != shim.StatusStopped {
		t.Fatalf("new shim, quick: %+v %v", st, err)
	}
	if st, err := p.c.State(ctx, "long"); err != nil || st.Status != shim.StatusRunning || st.Pid != long.Pid {
		t.Fatalf("new shim, long: %+v %v", st, err)
	}
	if err := p.c.Kill(ctx, "long", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	// Wait works on a leftover too (by polling), without the exit code.
	if st := p.wait("long"); st.Status != shim.StatusStopped || st.ExitCode != shim.UnknownExitCode {
		t.Fatalf("new shim, long after kill: %+v", st)
	}
	if !waitGone(t, long.Pid) {
		t.Fatal("leftover not killed")
	}
	// cleanup deletes both through the new shim and checks the cgroups.
}

// TestShimRSS reports the idle shim's memory with one running container,
// and what two more add, and bounds what each pod pays for it.
func TestShimRSS(t *testing.T) {
	p := newPod(t)
	c0 := p.run("c0", []string{"sleep", "1000"})
	// The shim keeps transparent huge pages off for itself (a kernel that
	// defaults to them would fold its stacks into 2 MiB pages); its
	// containers keep the node's policy.
	if got := status(p.pid, "THP_enabled"); got != "0" {
		t.Errorf("shim THP_enabled = %q, want 0", got)
	}
	if got := status(c0.Pid, "THP_enabled"); got != "1" {
		t.Errorf("container THP_enabled = %q, want 1 (the node's policy)", got)
	}
	mem := func(what string) {
		t.Logf("%s: VmRSS %s (RssAnon %s, RssFile %s), Pss %s, AnonHugePages %s, threads %s", what,
			status(p.pid, "VmRSS"), status(p.pid, "RssAnon"), status(p.pid, "RssFile"),
			rollup(p.pid, "Pss"), rollup(p.pid, "AnonHugePages"), status(p.pid, "Threads"))
	}
	settle()
	mem("idle shim, one container")
	for _, id := range []string{"c1", "c2"} {
		p.run(id, []string{"sleep", "1000"})
	}
	settle()
	mem("idle shim, three containers")
	// A second shim shares the binary's pages: its Pss shows the part
	// that is per pod.
	q := newPod(t)
	q.run("c0", []string{"sleep", "1000"})
	settle()
	mem("first shim, with a second shim running")

	// What each pod pays for its shim, with room for noise: the anonymous
	// memory in small pages (heap, stacks, runtime metadata: about 1.2 MiB
	// since libcontainer runs in berth-shim-helper, 2.7 MiB while the shim ran it
	// itself), in huge pages (on the VM's kernel, whose transparent huge
	// pages default to always, the one 2 MiB page the Go runtime may fault
	// in its heap before the shim turns them off for itself), the threads
	// (7), the binary's pages it maps (4.7 MiB for this unstripped build,
	// 3.2 MiB of the Makefile's: the kernel maps the page cache's large
	// folios whole, so all of it; 7.7 MiB while the shim carried
	// libcontainer), and the proportional share once a second shim shares
	// those pages (about 3 MiB). A change that grows one of them past its
	// bound is a per-pod cost multiplied by every pod of a node.
	anon, huge := kB(t, status(p.pid, "RssAnon")), kB(t, rollup(p.pid, "AnonHugePages"))
	for _, b := range []struct {
		what  string
		value int
		max   int
	}{
		{"RssAnon in small pages (kB)", anon - huge, 5 << 9},
		{"AnonHugePages (kB)", huge, 2 << 10},
		{"threads", kB(t, status(p.pid, "Threads")), 12},
		{"RssFile (kB)", kB(t, status(p.pid, "RssFile")), 6 << 10},
		{"Pss beside a second shim (kB)", kB(t, rollup(p.pid, "Pss")), 5 << 10},
	} {
		if b.value > b.max {
			t.Errorf("shim %s = %d, want at most %d", b.what, b.value, b.max)
		}
	}
}

// kB parses a figure of /proc/<pid>/status or smaps_rollup, such as
// "2612 kB" (or a plain count: "7").
func kB(t *testing.T, v string) int {
	n, err := strconv.Atoi(strings.TrimSuffix(v, " kB"))
	if err != nil {
		t.Fatalf("memory figure %q: %v", v, err)
	}
	return n
}

// settle waits until a shim has given back what its last container
// operation used: it does so a second after the operation (trimSoon),
// which under the VM tier's emulation takes a while longer.
func settle() { time.Sleep(2500 * time.Millisecond) }

// rollup reads a field of /proc/<pid>/smaps_rollup.
func rollup(pid int, field string) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// A container that cannot start fails Create and leaves nothing behind;
// its ID can be used again.
func TestCreateFails(t *testing.T) {
	p := newPod(t)
	p.writeSpec("c", []string{"/no/such/binary"})
	err := p.c.Create(ctxT(t), shim.CreateRequest{ID: "c", LogPath: p.logPath("c")})
	if err == nil {
		t.Fatal("Create of a missing binary succeeded")
	}
	t.Logf("Create: %v", err)
	if _, err := p.c.State(ctxT(t), "c"); !shim.IsNotFound(err) {
		t.Fatalf("State after a failed Create: %v", err)
	}
	if left := leftCgroups(); len(left) > 0 {
		t.Fatalf("cgroups left: %v", left)
	}
	if ents, _ := os.ReadDir(filepath.Join(p.dir, shim.StateRoot)); len(ents) > 0 {
		t.Fatalf("libcontainer state left: %v", ents)
	}
	p.run("c", []string{"true"})
	if st := p.wait("c"); st.ExitCode != 0 {
		t.Fatalf("state %+v", st)
	}
}

func TestOOMKilled(t *testing.T) {
	p := newPod(t)
	limit := int64(32 << 20)
	// tail keeps the "last line" of /dev/zero, which never ends.
	p.run("c", []string{"tail", "/dev/zero"}, func(s *specs.Spec) {
		s.Linux.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
	})
	st := p.wait("c")
	if st.ExitCode != 137 || !st.OOMKilled {
		t.Fatalf("state %+v", st)
	}
	if _, ex, _ := shim.ReadRecords(shim.ContainerDir(p.dir, "c")); ex == nil || !ex.OOMKilled {
		t.Fatalf("exit record %+v", ex)
	}
}

// TestEventsPushed: a first Events call is a snapshot; the next ones wait
// and bring each change (created, started, exited with its code, deleted)
// in order, each with the state after it.
func TestEventsPushed(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	snap, err := p.c.Events(ctx, 0)
	if err != nil || !snap.Snapshot || len(snap.Events) != 0 {
		t.Fatalf("first Events: %+v %v, want an empty snapshot", snap, err)
	}
	p.run("c", []string{"sh", "-c", "exit 7"})
	p.wait("c")
	if err := p.c.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	var got []shim.Event
	for after := snap.Seq; len(got) < 4; {
		r, err := p.c.Events(ctx, after)
		if err != nil || r.Snapshot || r.Quit {
			t.Fatalf("Events(%d): %+v %v", after, r, err)
		}
		got, after = append(got, r.Events...), r.Seq
	}
	kinds := []string{shim.EventCreated, shim.EventStarted, shim.EventExited, shim.EventDeleted}
	for i, e := range got {
		if i >= len(kinds) || e.Kind != kinds[i] || e.State.ID != "c" {
			t.Fatalf("events %+v, want %v of c", got, kinds)
		}
	}
	if ex := got[2].State; ex.Status != shim.StatusStopped || ex.ExitCode != 7 || ex.FinishedAt.IsZero() {
		t.Errorf("exited event state %+v, want stopped, code 7", ex)
	}
}

// TestContainerExitsWhileExecsComeIn: a container whose PID 1 ends while
// execs keep coming (a probe every second, as in Kubernetes' e2e suite)
// exits. An exec that was joining the container's PID namespace as it
// died is killed by the kernel and left a zombie of the exec server;
// unreaped, it held the container's init in its exit forever, and
// StopContainer failed with "still runs after SIGKILL".
func TestContainerExitsWhileExecsComeIn(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	for round := range 4 {
		id := fmt.Sprint("c", round)
		p.run(id, []string{"sh", "-c", "sleep 0.5; exit 3"})
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				p.c.Exec(ctx, shim.ExecRequest{ID: id, Args: []string{"true"}})
			}
		}()
		exited := make(chan shim.State, 1)
		go func() {
			st, _ := p.c.Wait(ctx, id)
			exited <- st
		}()
		select {
		case st := <-exited:
			if st.ExitCode != 3 {
				t.Errorf("round %d: state %+v, want exit code 3", round, st)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("round %d: the container did not exit within 10 s of its PID 1's end; the exec server's zombies: %v",
				round, zombieChildren(execServers(p.pid)...))
		}
		close(stop)
		<-done
		if t.Failed() {
			return
		}
	}
}

// zombieChildren lists the exited, unreaped children of the pids.
func zombieChildren(pids ...int) []string {
	var out []string
	var tasks []string
	for _, pid := range pids {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, e := range ents {
			tasks = append(tasks, fmt.Sprintf("/proc/%d/task/%s", pid, e.Name()))
		}
	}
	for _, task := range tasks {
		b, _ := os.ReadFile(task + "/children")
		for _, c := range strings.Fields(string(b)) {
			stat, _ := os.ReadFile("/proc/" + c + "/stat")
			i := strings.LastIndexByte(string(stat), ')')
			if i >= 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
				out = append(out, c+" "+string(stat[:i+1]))
			}
		}
	}
	return out
}

// execServers lists the shim's children that serve execs
// (berth-shim-helper helper --serve).
func execServers(shimPID int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		stat, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || !strings.Contains(string(cmd), shim.ExecServerArg) {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(shimPID) {
			out = append(out, pid)
		}
	}
	return out
}

// TestExecServerLingers: the execs of a container without berth-exec-init's
// settings (one whose settings it cannot apply) go through libcontainer:
// execs close together through one exec server that serves them, which is
// let go once no exec came for a moment, and the next exec starts another;
// the shim's exit takes it along.
func TestExecServerLingers(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.run("c", []string{"sleep", "1000"})
	if err := os.Remove(filepath.Join(shim.ContainerDir(p.dir, "c"), shim.ExecInitFile)); err != nil {
		t.Fatal(err)
	}
	var servers []int
	for i := range 3 {
		r, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"echo", strconv.Itoa(i)}})
		if err != nil || string(r.Stdout) != strconv.Itoa(i)+"\n" {
			t.Fatalf("exec %d: %+v %v", i, r, err)
		}
		servers = append(servers, execServers(p.pid)...)
	}
	if len(servers) != 3 || servers[0] != servers[1] || servers[1] != servers[2] {
		t.Fatalf("exec servers during three execs: %v, want the same one each time", servers)
	}
	if !waitGone(t, servers[0]) {
		t.Fatalf("the exec server %d outlived its idle time", servers[0])
	}
	r, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"echo", "again"}})
	if err != nil || string(r.Stdout) != "again\n" {
		t.Fatalf("exec after the exec server went: %+v %v", r, err)
	}
	again := execServers(p.pid)
	if len(again) != 1 || again[0] == servers[0] {
		t.Fatalf("exec servers after the first went: %v", again)
	}
	p.c.Kill(ctx, "c", syscall.SIGKILL, false)
	p.wait("c")
	if err := p.c.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	p.ids = nil
	if err := p.c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !waitGone(t, again[0]) {
		t.Fatal("the exec server outlived its shim")
	}
	// As berthd does: a shim on its way out removes its socket, which
	// would be the next one's, started too soon.
	if !waitGone(t, p.pid) {
		t.Fatal("the shim outlived its Shutdown")
	}
	p.start() // for the cleanup
}

// TestExecInitSealed: an exec goes through berth-exec-init, the shim's
// child, which runs from a sealed memfd: no file of the host's that root in
// the container could reopen for writing through /proc/PID/exe.
func TestExecInitSealed(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	p.run("c", []string{"sleep", "1000"})
	const marker = "987657"
	done := make(chan error, 1)
	go func() {
		r, err := p.c.Exec(ctx, shim.ExecRequest{ID: "c", Args: []string{"sleep", marker}})
		if err == nil && r.ExitCode != 137 {
			err = fmt.Errorf("exit code %d, want 137", r.ExitCode)
		}
		done <- err
	}()
	var pids []int
	eventually(t, "the exec'd sleep", func() bool { pids = procsWithArg(marker); return len(pids) == 1 })
	init := parentPID(t, pids[0])
	if pp := parentPID(t, init); pp != p.pid {
		t.Fatalf("the exec's parent %d is the child of %d, not of the shim %d", init, pp, p.pid)
	}
	exe := fmt.Sprintf("/proc/%d/exe", init)
	if target, err := os.Readlink(exe); err != nil || !strings.HasPrefix(target, "/memfd:"+shim.ExecInitBinary) {
		t.Errorf("the exec init runs %q (%v), want the sealed memfd", target, err)
	}
	// Sealed against writes, not only busy while it runs (ETXTBSY): the
	// attack reopens the file once the process is gone.
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	f.Close()
	if want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE; err != nil || seals&want != want {
		t.Errorf("the exec init's seals: %#x (%v), want %#x", seals, err, want)
	}
	syscall.Kill(pids[0], syscall.SIGKILL)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func parentPID(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	pp, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return pp
}
