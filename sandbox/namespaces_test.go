package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerNamespaces: the pod's modes repeated pass, a container's own
// PID mode is honoured where the pod allows it, TARGET names the running
// target whose PID namespace is joined, and the rest is refused naming the
// field.
func TestContainerNamespaces(t *testing.T) {
	const pod, ctr, node, target = runtimeapi.NamespaceMode_POD, runtimeapi.NamespaceMode_CONTAINER,
		runtimeapi.NamespaceMode_NODE, runtimeapi.NamespaceMode_TARGET
	m := testManager(t)
	opts := func(net, ipc, pid runtimeapi.NamespaceMode) *runtimeapi.NamespaceOption {
		return &runtimeapi.NamespaceOption{Network: net, Ipc: ipc, Pid: pid}
	}
	podOf := func(id string, o *runtimeapi.NamespaceOption, pausePID int) *store.Pod {
		return &store.Pod{ID: id, PausePID: pausePID, Config: &runtimeapi.PodSandboxConfig{
			Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: o}}}}
	}
	own, shared, host := podOf("p1", opts(pod, pod, ctr), 0), podOf("p2", opts(pod, pod, pod), 42), podOf("p3", opts(node, node, node), 0)
	m.addTestContainer(t, "running", "p1")
	m.store.SetState(shim.State{ID: "running", Status: shim.StatusRunning, Pid: 1234})
	m.addTestContainer(t, "created", "p1")
	m.store.SetState(shim.State{ID: "created", Status: shim.StatusCreated})
	m.addTestContainer(t, "elsewhere", "p2")
	m.store.SetState(shim.State{ID: "elsewhere", Status: shim.StatusRunning, Pid: 99})
	withTarget := func(id string) *runtimeapi.NamespaceOption {
		o := opts(pod, pod, target)
		o.TargetId = id
		return o
	}
	for _, c := range []struct {
		name    string
		pod     *store.Pod
		ctr     *runtimeapi.NamespaceOption
		want    pidNS
		kind    *errkind.Kind
		mention string
	}{
		{name: "no options, own", pod: own},
		{name: "no options, shared", pod: shared, want: pidNS{path: "/proc/42/ns/pid"}},
		{name: "no options, host", pod: host, want: pidNS{host: true}},
		{name: "pod's modes, own", pod: own, ctr: opts(pod, pod, ctr)},
		{name: "pod's modes, shared", pod: shared, ctr: opts(pod, pod, pod), want: pidNS{path: "/proc/42/ns/pid"}},
		{name: "pod's modes, host", pod: host, ctr: opts(node, node, node), want: pidNS{host: true}},
		{name: "own in shared pod", pod: shared, ctr: opts(pod, pod, ctr)},
		{name: "target", pod: own, ctr: withTarget("running"), want: pidNS{target: "running"}},
		{name: "target prefix", pod: own, ctr: withTarget("runn"), want: pidNS{target: "running"}},
		{name: "pod pid without one", pod: own, ctr: opts(pod, pod, pod), kind: errkind.Invalid, mention: ".pid"},
		{name: "host pid in private pod", pod: own, ctr: opts(pod, pod, node), kind: errkind.Invalid, mention: ".pid"},
		{name: "private pid in host pod", pod: host, ctr: opts(node, node, ctr), kind: errkind.Invalid, mention: ".pid"},
		{name: "network differs", pod: own, ctr: opts(node, pod, ctr), kind: errkind.Invalid, mention: ".network"},
		{name: "ipc differs", pod: own, ctr: opts(pod, node, ctr), kind: errkind.Invalid, mention: ".ipc"},
		{name: "target missing", pod: own, ctr: withTarget(""), kind: errkind.Invalid, mention: "target_id"},
		{name: "target unknown", pod: own, ctr: withTarget("nope"), kind: errkind.NotFound, mention: "target_id"},
		{name: "target not running", pod: own, ctr: withTarget("created"), kind: errkind.FailedPrecondition, mention: "target_id"},
		{name: "target in another pod", pod: own, ctr: withTarget("elsewhere"), kind: errkind.Invalid, mention: "target_id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &runtimeapi.ContainerConfig{}
			if c.ctr != nil {
				cfg.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: c.ctr}}
			}
			got, err := m.containerNamespaces(c.pod, cfg)
			if c.kind == nil {
				if err != nil || got != c.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
				}
				return
			}
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("error %v, want %v mentioning %q", err, c.kind, c.mention)
			}
		})
	}
}

// TestPinPIDNamespaceReusedPID: the target exits and another process takes
// its PID after berthd learned the PID and before the namespace is pinned
// (the shim still said the target runs): the pin is refused as the target
// gone, and none is left, where /proc/<PID>/ns/pid, which berthd joined
// before (#34, finding 7), names the other process's namespace.
func TestPinPIDNamespaceReusedPID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: pins are bind mounts, and the PID is taken again through ns_last_pid")
	}
	target := startInOwnPIDNamespace(t, -1)
	pid := target.Process.Pid
	targetNS := inode(t, fmt.Sprintf("/proc/%d/ns/pid", pid))
	pin := filepath.Join(t.TempDir(), "pin")
	err := pinLiveProcessPIDNamespace(pin, pid, func() error {
		target.Process.Kill()
		target.Wait()
		startInOwnPIDNamespace(t, pid)
		return nil
	})
	if now := inode(t, fmt.Sprintf("/proc/%d/ns/pid", pid)); now == targetNS {
		t.Fatalf("/proc/%d/ns/pid still names the target's namespace: the test proves nothing", pid)
	}
	if !errors.Is(err, errProcessGone) {
		t.Errorf("pin once the PID is another's: %v, want %v", err, errProcessGone)
	}
	if _, err := os.Lstat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a pin is left: %v", err)
	}

	// A process that lives on is pinned, once confirmed.
	live := startInOwnPIDNamespace(t, -1)
	want := inode(t, fmt.Sprintf("/proc/%d/ns/pid", live.Process.Pid))
	refused := errors.New("not the target")
	if err := pinLiveProcessPIDNamespace(pin, live.Process.Pid, func() error { return refused }); err != refused {
		t.Errorf("pin when confirm refuses: %v, want %v", err, refused)
	}
	if err := pinLiveProcessPIDNamespace(pin, live.Process.Pid, func() error { return nil }); err != nil {
		t.Fatalf("pin of a live process: %v", err)
	}
	if got := inode(t, pin); got != want {
		t.Errorf("the pin is namespace %d, want the process's %d", got, want)
	}
	if err := podns.RemovePin(pin); err != nil {
		t.Error(err)
	}
}

// startInOwnPIDNamespace starts a sleeping process in a PID namespace of
// its own, killed when the test ends; with pid > 0, as that PID (the
// kernel hands out the PID after ns_last_pid, which another process may
// take first: tried again until it comes).
func startInOwnPIDNamespace(t *testing.T, pid int) *exec.Cmd {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if pid > 0 {
			if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("/bin/sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if pid <= 0 || cmd.Process.Pid == pid {
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			return cmd
		}
		cmd.Process.Kill()
		cmd.Wait()
		if time.Now().After(deadline) {
			t.Fatalf("PID %d never came again", pid)
		}
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
