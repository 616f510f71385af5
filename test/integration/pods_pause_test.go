package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/test/harness"
)

// TestPauseDeath: in a pod sharing one PID namespace the pause is PID 1,
// and root in any container can signal it. Signals from the pod leave it
// (and so every container) running; when it dies anyway (killed from the
// node) the pod turns NOTREADY, so the kubelet recreates it, and no
// container can be added to it any more.
func TestPauseDeath(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	const pod = runtimeapi.NamespaceMode_POD
	cfg := podWithNamespaces(e, "pause-death", &runtimeapi.NamespaceOption{Network: pod, Ipc: pod, Pid: pod})
	id := e.runPod(t, cfg)
	ctr := e.runContainer(t, id, cfg, e.ctrConfig("signaller", sleeper...))
	var info struct {
		Pod struct {
			PausePID int `json:"pausePID"`
		} `json:"pod"`
	}
	e.verbosePodInfo(t, id, &info)
	pause := info.Pod.PausePID
	if pause == 0 || !alive(pause) {
		t.Fatalf("no live pause process (pid %d)", pause)
	}

	for _, sig := range []string{"TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "SEGV", "ABRT", "PIPE", "ALRM", "STOP"} {
		e.sh(t, ctr, "kill -"+sig+" 1")
	}
	time.Sleep(300 * time.Millisecond)
	if !alive(pause) {
		t.Fatal("a signal from a container ended the pause")
	}
	if st := e.podStatus(t, id).State; st != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod is %v after the signals, want READY", st)
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)

	if err := syscall.Kill(pause, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool {
		return e.podStatus(t, id).State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	}) {
		t.Fatal("the pod is still READY after its pause died")
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: id, SandboxConfig: cfg, Config: e.ctrConfig("late", sleeper...)})
	assertCode(t, err, one(codes.FailedPrecondition), "not ready")

	e.removePod(t, id)
	e.assertNoLeaks(t)
}

// TestPauseHoldsNoPrivilege: root in a container of a shared-PID pod may
// trace or signal its PID 1, the pause, so the pause must hold nothing a
// container does not have. It runs as 65535:65535, or as the pod's
// run_as_user and run_as_group, or in a user-namespace pod as 65535 of that
// namespace; with no supplementary groups, no capabilities in any set and
// no_new_privs; and non-dumpable, so a container process with the pause's
// own uid, which may trace a process of its uid like any other (shown on a
// child of its own), can neither attach to the pause nor read its
// environment.
func TestPauseHoldsNoPrivilege(t *testing.T) {
	t.Parallel()
	// The user-namespace pod needs idmapped mounts on the state folder (see
	// TestUserNamespacePod).
	e := startPodEnvWith(t, v1.Config{}, harness.Options{State: stateOnTmpfs(t)})
	p := e.reg.Push(t, "berth/ptrace:pause", harness.BusyboxImage(t, harness.ImageSpec{
		Layers: [][]harness.File{{harness.Reg("ptrace", string(buildPtraceTool(t)), 0o755)}}}))
	mustPull(t, e.d, p.Name, p.ID)
	id := func(v int64) *runtimeapi.Int64Value { return &runtimeapi.Int64Value{Value: v} }

	t.Run("default", func(t *testing.T) {
		cfg := podWithNamespaces(e, "pause-nobody", &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_POD})
		pod := e.runPod(t, cfg)
		pause := pausePID(t, e, pod)
		assertPauseCreds(t, pause, 65535, 65535)
		assertNotDumpable(t, pause, 0)

		// A container process with the pause's uid and gid and the default
		// capabilities (none of them CAP_SYS_PTRACE).
		cc := e.ctrConfig("same-uid", sleeper...)
		cc.Image.Image = p.Name
		cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			RunAsUser: id(65535), RunAsGroup: id(65535)}}
		ctr := e.runContainer(t, pod, cfg, cc)
		const probe = "/bin/sleep 100 & sibling=$!; " +
			"cat /proc/$sibling/environ >/dev/null && echo sibling environ readable; " +
			"cat /proc/1/environ 2>&1 >/dev/null; /ptrace child 1; kill $sibling"
		want := "sibling environ readable\n" +
			"cat: can't open '/proc/1/environ': Permission denied\n" +
			"child: attached\n" +
			"1: operation not permitted"
		if got := e.sh(t, ctr, probe); got != want {
			t.Errorf("a process with the pause's uid, on its sibling, a child of its own and the pause:\n%s\nwant\n%s", got, want)
		}
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
	})

	t.Run("pod-user", func(t *testing.T) {
		cfg := podWithNamespaces(e, "pause-pod-user", &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_POD})
		cfg.Linux.SecurityContext.RunAsUser, cfg.Linux.SecurityContext.RunAsGroup = id(1000), id(2000)
		pod := e.runPod(t, cfg)
		pause := pausePID(t, e, pod)
		assertPauseCreds(t, pause, 1000, 2000)
		assertNotDumpable(t, pause, 0)
		e.removePod(t, pod)
	})

	t.Run("user-namespace", func(t *testing.T) {
		if !e.userNamespaces(t) {
			t.Skipf("Linux %s: user namespaces not advertised", kernelRelease(t))
		}
		cfg := e.podConfig("pause-userns")
		m := rootMapping(usernsHost, 65536)
		usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
		pod := e.runPod(t, cfg)
		pause := pausePID(t, e, pod)
		assertPauseCreds(t, pause, usernsHost+65535, usernsHost+65535)
		// Non-dumpable, its /proc files are the namespace's root's.
		assertNotDumpable(t, pause, usernsHost)

		// A run_as_user the namespace does not map is refused.
		short := rootMapping(usernsHost, 1000)
		cfg = e.podConfig("pause-userns-unmapped")
		usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: short, Gids: short}, runtimeapi.NamespaceMode_POD)
		cfg.Linux.SecurityContext.RunAsUser = id(1000)
		_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		assertCode(t, err, one(codes.InvalidArgument), "linux.security_context.run_as_user", "ID 1000 is not mapped")
		e.removePod(t, pod)
	})
	e.assertNoLeaks(t)
}

// TestPauseProcMasked: root in a container of a shared-PID pod given
// CAP_SYS_PTRACE reaches the pause's own /proc through /proc/1/root. That
// /proc is masked as a default container's: kernel.core_pattern (host root
// to whoever writes it) is read there but cannot be opened for writing, and
// /proc/timer_list reads nothing. The probe opens core_pattern for
// appending and writes nothing, so that it changes nothing even where the
// open succeeds.
func TestPauseProcMasked(t *testing.T) {
	t.Parallel()
	const corePattern = "/proc/sys/kernel/core_pattern"
	before, err := os.ReadFile(corePattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if now, err := os.ReadFile(corePattern); err == nil && string(now) != string(before) {
			t.Errorf("the host's core_pattern changed to %q; restoring %q", now, before)
			os.WriteFile(corePattern, before, 0)
		}
	})
	e := startPodEnv(t, v1.Config{})
	cfg := podWithNamespaces(e, "pause-proc", &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_POD})
	pod := e.runPod(t, cfg)
	cc := e.ctrConfig("tracer", sleeper...)
	cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
		Capabilities: &runtimeapi.Capability{AddCapabilities: []string{"SYS_PTRACE"}},
		MaskedPaths:  spec.DefaultMaskedPaths, ReadonlyPaths: spec.DefaultReadonlyPaths}}
	ctr := e.runContainer(t, pod, cfg, cc)

	// The pause's /proc is reached at all: its core_pattern is the host's.
	if got := e.sh(t, ctr, "cat /proc/1/root"+corePattern); got+"\n" != string(before) {
		t.Fatalf("core_pattern through /proc/1/root reads %q, want the host's %q", got, before)
	}
	r := e.exec(t, ctr, "/bin/sh", "-c", ": >>/proc/1/root"+corePattern+" && echo opened")
	if r.stdout != "" || !strings.Contains(r.stderr, "Read-only file system") {
		t.Errorf("opening core_pattern through /proc/1/root for writing: stdout %q, stderr %q, want it refused as read-only", r.stdout, r.stderr)
	}
	if got := e.sh(t, ctr, "/bin/busybox head -c 100 /proc/1/root/proc/timer_list"); got != "" {
		t.Errorf("/proc/timer_list through /proc/1/root reads %q, want nothing (masked)", got)
	}
	e.stop(t, ctr, 0)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// pausePID is the host PID of the pod's pause (verbose status).
func pausePID(t *testing.T, e *podEnv, pod string) int {
	t.Helper()
	var info struct {
		Pod struct {
			PausePID int `json:"pausePID"`
		} `json:"pod"`
	}
	e.verbosePodInfo(t, pod, &info)
	if info.Pod.PausePID == 0 {
		t.Fatalf("pod %s has no pause process", pod)
	}
	return info.Pod.PausePID
}

// assertPauseCreds checks, from the host, the pause's IDs (real, effective,
// saved, filesystem), that it has no supplementary groups and no
// capabilities, and that no_new_privs is set.
func assertPauseCreds(t *testing.T, pid int, uid, gid uint32) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	status := string(b)
	want := map[string]string{
		"Uid": strings.Repeat(fmt.Sprintf("\t%d", uid), 4), "Gid": strings.Repeat(fmt.Sprintf("\t%d", gid), 4),
		"Groups": "\t", "NoNewPrivs": "\t1",
		"CapInh": "\t0000000000000000", "CapPrm": "\t0000000000000000", "CapEff": "\t0000000000000000",
		"CapBnd": "\t0000000000000000", "CapAmb": "\t0000000000000000",
	}
	for field, value := range want {
		m := regexp.MustCompile(`(?m)^` + field + `:(.*)$`).FindStringSubmatch(status)
		if m == nil || strings.TrimRight(m[1], " ") != value {
			t.Errorf("pause %s: %q, want %q", field, m, value)
		}
	}
}

// assertNotDumpable checks that the pause is not dumpable: the kernel makes
// the private /proc files of such a process (environ, not the folder) its
// user namespace's root's (root, or the host uid root maps to in a user
// namespace), not its own uid's.
func assertNotDumpable(t *testing.T, pid int, root uint32) {
	t.Helper()
	p := fmt.Sprintf("/proc/%d/environ", pid)
	if owner := hostOwner(t, p); owner != root {
		t.Errorf("%s belongs to uid %d, want %d: the pause is dumpable", p, owner, root)
	}
}

// userNamespaces tells whether berthd advertises user-namespace pods.
func (e *podEnv) userNamespaces(t *testing.T) bool {
	t.Helper()
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h := st.GetRuntimeHandlers()
	return len(h) == 1 && h[0].GetFeatures().GetUserNamespaces()
}

// ptraceToolSource attaches (PTRACE_ATTACH) to each PID it is given, or to
// a child of its own for "child", and prints "ARG: attached" or the error.
const ptraceToolSource = `package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
)

func main() {
	runtime.LockOSThread() // ptrace requests come from the tracer thread
	for _, arg := range os.Args[1:] {
		var pid int
		if arg == "child" {
			c := exec.Command("/bin/sleep", "100")
			if err := c.Start(); err != nil {
				fmt.Println(arg+":", err)
				continue
			}
			defer c.Process.Kill()
			pid = c.Process.Pid
		} else if n, err := strconv.Atoi(arg); err == nil {
			pid = n
		} else {
			fmt.Println(arg+":", err)
			continue
		}
		if err := syscall.PtraceAttach(pid); err != nil {
			fmt.Println(arg+":", err)
			continue
		}
		fmt.Println(arg + ": attached")
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, syscall.WALL, nil) // its attach stop
		syscall.PtraceDetach(pid)
	}
}
`

// buildPtraceTool builds ptraceToolSource as a static binary (busybox has
// no ptrace tool) and returns it.
func buildPtraceTool(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(ptraceToolSource), 0o644); err != nil {
		t.Fatal(err)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(goTool, "build", "-trimpath", "-o", "ptrace", "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the ptrace tool: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "ptrace"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
