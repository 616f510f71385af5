package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
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
	e := &podEnv{d: d, reg: reg, logs: t.TempDir(), parent: "berth-itest/" + filepath.Base(d.State)}
	t.Cleanup(func() { e.teardown(t) })
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

func systemctlShow(t *testing.T, unit, prop string) string {
	t.Helper()
	out, err := exec.Command("systemctl", "show", "-P", prop, unit).Output()
	if err != nil {
		t.Fatalf("systemctl show -P %s %s: %v", prop, unit, err)
	}
	return strings.TrimSpace(string(out))
}
