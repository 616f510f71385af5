package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// TestSystemdDriver runs berthd with cgroup_driver = "systemd" on a machine
// that runs systemd: RuntimeConfig reports SYSTEMD, the pod's cgroup is the
// kubelet's slice and its container runs in the scope berth-<id>.scope in
// that slice, and removal stops both. Hosts without systemd skip it; the VM
// tier's systemd mode (BERTH_VM_INIT=systemd test/vm/run.sh) runs it, and
// there a missing systemd fails it.
func TestSystemdDriver(t *testing.T) {
	harness.RequireIntegration(t)
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		if os.Getenv("BERTH_VM_SYSTEMD") == "1" {
			t.Fatal("BERTH_VM_SYSTEMD=1 but no /run/systemd/system: systemd is not PID 1 in the VM")
		}
		t.Skip("this host does not run systemd (no /run/systemd/system); the VM tier's systemd mode (BERTH_VM_INIT=systemd test/vm/run.sh) runs this test")
	}
	t.Parallel()
	// Top-level keys go before the registry tables start() writes.
	reg := harness.NewRegistry(t)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: "cgroup_driver = \"systemd\"\n" + harness.PlainHTTP(reg.Host())})
	e := newPodEnv(t, d, reg)
	// The QoS slices systemd made as the pod slice's parents.
	t.Cleanup(func() { _ = exec.Command("systemctl", "stop", "kubepods-besteffort.slice", "kubepods.slice").Run() })
	e.image = e.pushImage(t, "berth/busybox:systemd", v1.Config{})

	rc, err := d.Runtime.RuntimeConfig(ctx(t), &runtimeapi.RuntimeConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.GetLinux().GetCgroupDriver(); got != runtimeapi.CgroupDriver_SYSTEMD {
		t.Errorf("RuntimeConfig cgroup driver = %s, want SYSTEMD", got)
	}

	slice := "kubepods-besteffort-podsd1.slice"
	cfg := e.podConfig("systemd")
	cfg.Linux.CgroupParent = slice
	pod := e.runPod(t, cfg)
	var info struct {
		Pod struct {
			Cgroup string `json:"cgroup"`
		} `json:"pod"`
	}
	e.verbosePodInfo(t, pod, &info)
	if info.Pod.Cgroup != slice {
		t.Errorf("pod cgroup = %q, want the kubelet's slice %q", info.Pod.Cgroup, slice)
	}
	sliceDir := filepath.Join("/sys/fs/cgroup", "kubepods.slice", "kubepods-besteffort.slice", slice)
	if _, err := os.Stat(sliceDir); err != nil {
		t.Fatalf("pod slice: %v", err)
	}
	if got := systemctlShow(t, slice, "ActiveState"); got != "active" {
		t.Errorf("%s ActiveState = %q", slice, got)
	}

	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("sd", sleeper...))
	scope := "berth-" + ctr + ".scope"
	scopeDir := filepath.Join(sliceDir, scope)
	procs, err := os.ReadFile(filepath.Join(scopeDir, "cgroup.procs"))
	if err != nil {
		t.Fatalf("container scope: %v", err)
	}
	if pid := e.ctrPID(t, ctr); !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pid)) {
		t.Errorf("container pid %d not in %s (procs %q)", pid, scopeDir, procs)
	}
	if got := systemctlShow(t, scope, "Slice"); got != slice {
		t.Errorf("%s Slice = %q, want %q", scope, got, slice)
	}
	if got := systemctlShow(t, scope, "ActiveState"); got != "active" {
		t.Errorf("%s ActiveState = %q", scope, got)
	}
	st, err := d.Runtime.ContainerStats(ctx(t), &runtimeapi.ContainerStatsRequest{ContainerId: ctr})
	if err != nil || st.GetStats().GetMemory().GetUsageBytes().GetValue() == 0 {
		t.Errorf("ContainerStats through the scope = %v, %v", st.GetStats(), err)
	}

	oomKilledInScope(t, e, pod, cfg, sliceDir)

	for range 2 {
		if _, err := d.Runtime.StopPodSandbox(ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
			t.Fatalf("StopPodSandbox: %v", err)
		}
	}
	if _, err := d.Runtime.RemovePodSandbox(ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	for _, dir := range []string{scopeDir, sliceDir} {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("cgroup %s left behind", dir)
		}
	}
	if got := systemctlShow(t, slice, "ActiveState"); got == "active" {
		t.Errorf("%s still active after RemovePodSandbox", slice)
	}
}

// oomKilledInScope runs a container past its memory limit in the pod:
// systemd removes its scope once the OOM-killed process is gone, often
// before the shim reaps it, and the status must still say OOMKilled.
func oomKilledInScope(t *testing.T, e *podEnv, pod string, cfg *runtimeapi.PodSandboxConfig, sliceDir string) {
	t.Helper()
	cc := e.ctrConfig("oom", "/bin/sh", "-c", "x=$(/bin/busybox head -c 67108864 /dev/zero | /bin/busybox tr '\\0' a); echo survived ${#x}")
	cc.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}}
	id := e.create(t, pod, cfg, cc)
	e.start(t, id)
	st := e.waitState(t, id, runtimeapi.ContainerState_CONTAINER_EXITED)
	if st.ExitCode != 137 || st.Reason != "OOMKilled" {
		t.Errorf("the container past its limit: exit code %d, reason %q; want 137, OOMKilled", st.ExitCode, st.Reason)
	}
	scopeDir := filepath.Join(sliceDir, "berth-"+id+".scope")
	if !eventually(time.Minute, func() bool { _, err := os.Stat(scopeDir); return err != nil }) {
		t.Errorf("systemd kept the exited container's scope %s: the test no longer shows a scope gone before the exit is read", scopeDir)
	}
}

func systemctlShow(t *testing.T, unit, prop string) string {
	t.Helper()
	out, err := exec.Command("systemctl", "show", "-P", prop, unit).Output()
	if err != nil {
		t.Fatalf("systemctl show -P %s %s: %v", prop, unit, err)
	}
	return strings.TrimSpace(string(out))
}

// TestSystemdUnitRestartKeepsContainers installs berthd.service (the unit
// `make install` installs, with a drop-in that points it at this test's
// binaries and folders), runs a container through it, and checks that
// `systemctl restart berthd` replaces berthd and leaves the shim and the
// container running (KillMode=process), that the new berthd reports the
// container RUNNING, and that `systemctl reload` keeps berthd's PID. It
// changes the machine's systemd setup, so it runs only in the VM tier's
// systemd mode (BERTH_VM_SYSTEMD=1).
func TestSystemdUnitRestartKeepsContainers(t *testing.T) {
	harness.RequireIntegration(t)
	if os.Getenv("BERTH_VM_SYSTEMD") != "1" {
		t.Skip("installs a systemd unit: runs in the VM tier's systemd mode only (BERTH_VM_INIT=systemd test/vm/run.sh)")
	}
	unitFile := "/berth/berthd.service" // test/vm/run.sh puts it there
	reg := harness.NewRegistry(t)
	p := reg.Push(t, "berth/busybox:unit", harness.BusyboxImage(t, harness.ImageSpec{}))
	// Beside the machine's folders, not in the tests' /tmp: whatever the
	// VM's systemd does to /tmp, berthd.service sees its files.
	base, err := os.MkdirTemp("/var/lib", "berth-unit-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	root, state, logFile := filepath.Join(base, "root"), filepath.Join(base, "state"), filepath.Join(base, "berthd.log")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("berthd.service output:\n%s\nsystemctl status:\n%s", b, systemctlStatus())
		}
	})
	parent := "berth-itest/unit-" + filepath.Base(state)
	sock := filepath.Join(state, "berth.sock")
	config := filepath.Join(base, "config.toml")
	bridge, subnet := harness.TestNetwork(t)
	toml := harness.PlainHTTP(reg.Host()) + fmt.Sprintf("[network]\nbridge = %q\nsubnet = %q\n", bridge, subnet)
	if err := os.WriteFile(config, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{root, state} {
		if err := os.Mkdir(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	dropIn := "/etc/systemd/system/berthd.service.d"
	writes := map[string]string{
		"/etc/systemd/system/berthd.service": string(unit),
		// The VM runs no journald: berthd's output goes to a file. The VM
		// boots into the test unit alone: the default dependencies would
		// start sysinit.target and basic.target now, whose tmp.mount
		// hides the tests' /tmp under a fresh tmpfs (a node has them up).
		dropIn + "/test.conf": fmt.Sprintf("[Unit]\nDefaultDependencies=no\n\n[Service]\nExecStart=\nExecStart=%s --config %s --root %s --state %s --socket %s --log-level debug\n"+
			"Restart=no\nStandardOutput=append:%s\nStandardError=append:%s\n",
			harness.BinaryPath(t, "berthd"), config, root, state, sock, logFile, logFile),
	}
	for path, body := range writes {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	systemctl := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
			t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		_ = exec.Command("systemctl", "stop", "berthd").Run()
		os.RemoveAll(dropIn)
		os.Remove("/etc/systemd/system/berthd.service")
		_ = exec.Command("systemctl", "daemon-reload").Run()
		for range 4 { // berthd's private bind mount of STATE/pods
			if unix.Unmount(filepath.Join(state, "pods"), unix.MNT_DETACH) != nil {
				break
			}
		}
		removeCgroupDirs(parent)
		removeCgroupDirs("berth-itest") // only once no other test uses it
	})
	systemctl("daemon-reload")
	for prop, want := range map[string]string{"KillMode": "process", "Delegate": "yes", "LimitNOFILE": "1048576"} {
		if got := systemctlShow(t, "berthd.service", prop); got != want {
			t.Errorf("berthd.service %s = %q, want %q", prop, got, want)
		}
	}
	systemctl("start", "berthd")

	rt, im := criClients(t, sock)
	if _, err := im.PullImage(ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: p.Name}}); err != nil {
		t.Fatal(err)
	}
	cfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "unit", Namespace: "default", Uid: "uid-unit"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/" + parent + "/pod-unit"}}
	pod, err := rt.RunPodSandbox(ctx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt, _ := criClients(t, sock)
		_, _ = rt.RemovePodSandbox(ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.PodSandboxId})
	})
	cc, err := rt.CreateContainer(ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, SandboxConfig: cfg,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "sleeper"},
			Image: &runtimeapi.ImageSpec{Image: p.Name}, Command: sleeper}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StartContainer(ctx(t), &runtimeapi.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		t.Fatal(err)
	}
	ctrPID := verbosePID(t, rt, cc.ContainerId)
	berthd := systemctlShow(t, "berthd.service", "MainPID")

	systemctl("restart", "berthd")
	if got := systemctlShow(t, "berthd.service", "MainPID"); got == berthd || got == "0" {
		t.Fatalf("berthd MainPID %s after restart, was %s: not replaced", got, berthd)
	}
	if err := syscall.Kill(ctrPID, 0); err != nil {
		t.Fatalf("container process %d after systemctl restart berthd: %v", ctrPID, err)
	}
	rt, _ = criClients(t, sock)
	st, err := rt.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: cc.ContainerId})
	if err != nil || st.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container after restart: %v, %v; want RUNNING", st.GetStatus().GetState(), err)
	}
	if got := verbosePID(t, rt, cc.ContainerId); got != ctrPID {
		t.Errorf("container pid %d after restart, was %d", got, ctrPID)
	}

	berthd = systemctlShow(t, "berthd.service", "MainPID")
	systemctl("reload", "berthd")
	if got := systemctlShow(t, "berthd.service", "MainPID"); got != berthd || systemctlShow(t, "berthd.service", "ActiveState") != "active" {
		t.Errorf("after systemctl reload: MainPID %s (was %s), %s", got, berthd, systemctlShow(t, "berthd.service", "ActiveState"))
	}
	if _, err := rt.RemovePodSandbox(ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(ctrPID, 0); err == nil {
		t.Errorf("container process %d still there after RemovePodSandbox", ctrPID)
	}
}

func systemctlStatus() string {
	out, _ := exec.Command("systemctl", "status", "--no-pager", "berthd").CombinedOutput()
	return string(out)
}

// criClients dials a berthd socket, waiting up to 20 s for it to answer.
func criClients(t *testing.T, sock string) (runtimeapi.RuntimeServiceClient, runtimeapi.ImageServiceClient) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	if !eventually(20*time.Second, func() bool {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := rt.Version(c, &runtimeapi.VersionRequest{})
		return err == nil
	}) {
		t.Fatalf("berthd on %s does not answer", sock)
	}
	return rt, runtimeapi.NewImageServiceClient(conn)
}

func verbosePID(t *testing.T, rt runtimeapi.RuntimeServiceClient, id string) int {
	t.Helper()
	st, err := rt.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid <= 0 {
		t.Fatalf("verbose status of %s: pid %d, %v", id, info.Pid, err)
	}
	return info.Pid
}
