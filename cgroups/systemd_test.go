package cgroups

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/systemd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The tests in this file drive the systemd cgroup driver against a real
// systemd. They run in the VM tier's systemd mode (BERTH_VM_INIT=systemd in
// test/vm/run.sh), where Debian's systemd is PID 1 and the tests run as its
// unit berth-vm-tests.service with BERTH_VM=1 and BERTH_VM_SYSTEMD=1; else
// they skip. In that mode a missing systemd is a failure, not a skip.
func requireSystemdVM(t *testing.T) *Manager {
	t.Helper()
	if os.Getenv("BERTH_VM") != "1" || os.Getenv("BERTH_VM_SYSTEMD") != "1" {
		t.Skip("systemd driver test: runs in the VM tier's systemd mode only (BERTH_VM_INIT=systemd test/vm/run.sh)")
	}
	if !exists("/run/systemd/system") {
		t.Fatal("BERTH_VM_SYSTEMD=1 but no /run/systemd/system: systemd is not PID 1 in the VM")
	}
	m, err := New(Systemd)
	if err != nil {
		t.Fatalf("New(systemd) under systemd: %v", err)
	}
	if m.Driver() != Systemd || m.Mode() != V2 {
		t.Fatalf("New(systemd): driver %v, mode %v; want systemd on v2", m.Driver(), m.Mode())
	}
	// The kubelet's QoS slices, created implicitly as the pod slices' parents,
	// are stopped at the end so that the VM's leak check sees nothing.
	t.Cleanup(func() {
		for _, s := range []string{"kubepods-burstable.slice", "kubepods.slice"} {
			if out, err := exec.Command("systemctl", "stop", s).CombinedOutput(); err != nil {
				t.Logf("systemctl stop %s: %v: %s", s, err, out)
			}
		}
	})
	return m
}

// unitProp reads one property of a systemd unit with systemctl show.
func unitProp(t *testing.T, unit, prop string) string {
	t.Helper()
	out, err := exec.Command("systemctl", "show", "-P", prop, unit).Output()
	if err != nil {
		t.Fatalf("systemctl show -P %s %s: %v", prop, unit, err)
	}
	return strings.TrimSpace(string(out))
}

// startScope does what runc does for a container whose cgroupsPath is
// "slice:prefix:name": a transient scope unit prefix-name.scope in the
// slice, with pid in it and the resources set. It is stopped at the end.
func startScope(t *testing.T, m *Manager, ctr string, pid int, res *runtimeapi.LinuxContainerResources) {
	t.Helper()
	parts := strings.Split(ctr, ":")
	if len(parts) != 3 {
		t.Fatalf("container cgroups path %q: want slice:prefix:name", ctr)
	}
	s, err := specResources(res, m.mode, 0, m.caps)
	if err != nil {
		t.Fatal(err)
	}
	r := libResources(s, m.mode)
	cg := &cgroups.Cgroup{Parent: parts[0], ScopePrefix: parts[1], Name: parts[2], Resources: r, Systemd: true}
	mgr, err := systemd.NewUnifiedManager(cg, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Apply(pid); err != nil {
		t.Fatalf("start scope for %s: %v", ctr, err)
	}
	t.Cleanup(func() { _ = mgr.Destroy() })
	if err := mgr.Set(r); err != nil {
		t.Fatalf("set scope resources for %s: %v", ctr, err)
	}
}

// TestSystemdPodSliceAndContainerScope creates a pod where the kubelet's
// systemd driver puts a burstable pod (kubepods-burstable-pod<uid>.slice),
// a container scope berth-<id>.scope in it with a process, and checks the
// units as systemd reports them, the cgroupfs paths and files, Stats and
// OOMKilled through the slice/scope path expansion, and removal.
func TestSystemdPodSliceAndContainerScope(t *testing.T) {
	m := requireSystemdVM(t)
	uid := "0b1c_sd"
	pod := m.PodCgroup("kubepods-burstable-pod"+uid+".slice", uid)
	if want := "kubepods-burstable-pod" + uid + ".slice"; pod != want {
		t.Fatalf("PodCgroup = %q, want the kubelet's cgroup_parent %q", pod, want)
	}
	res := &runtimeapi.LinuxContainerResources{CpuShares: 512, MemoryLimitInBytes: 128 << 20}
	if err := m.CreatePod(pod, res); err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(defaultRoot, "kubepods.slice", "kubepods-burstable.slice", pod)
	if !exists(podDir) {
		t.Fatalf("pod slice %s: no cgroup at %s", pod, podDir)
	}
	if got := unitProp(t, pod, "ActiveState"); got != "active" {
		t.Errorf("%s ActiveState = %q, want active", pod, got)
	}
	if got, want := unitProp(t, pod, "ControlGroup"), strings.TrimPrefix(podDir, defaultRoot); got != want {
		t.Errorf("%s ControlGroup = %q, want %q", pod, got, want)
	}
	if got := unitProp(t, pod, "MemoryMax"); got != strconv.Itoa(128<<20) {
		t.Errorf("%s MemoryMax = %q, want %d", pod, got, 128<<20)
	}
	checkFiles(t, podDir, map[string]string{
		"cpu.weight": strconv.FormatUint(SharesToWeight(512), 10),
		"memory.max": strconv.Itoa(128 << 20),
	})

	// A container: a scope with a process, as runc makes it.
	h := startHelper(t, "hold")
	ctr := m.ContainerCgroupsPath(pod, "c1")
	if want := pod + ":berth:c1"; ctr != want {
		t.Fatalf("ContainerCgroupsPath = %q, want %q", ctr, want)
	}
	startScope(t, m, ctr, h.cmd.Process.Pid, &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, CpuShares: 256})
	h.start(t)
	if line, err := h.out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}
	scopeDir := filepath.Join(podDir, "berth-c1.scope")
	procs := fields(t, filepath.Join(scopeDir, "cgroup.procs"))
	if !slices.Contains(procs, strconv.Itoa(h.cmd.Process.Pid)) {
		t.Errorf("helper pid %d not in %s (procs %v)", h.cmd.Process.Pid, scopeDir, procs)
	}
	if got := unitProp(t, "berth-c1.scope", "Slice"); got != pod {
		t.Errorf("berth-c1.scope Slice = %q, want %q", got, pod)
	}
	checkFiles(t, scopeDir, map[string]string{
		"memory.max": strconv.Itoa(64 << 20),
		"cpu.weight": strconv.FormatUint(SharesToWeight(256), 10),
	})
	st, err := m.Stats(ctr)
	if err != nil {
		t.Fatalf("Stats(%s): %v", ctr, err)
	}
	if st.MemoryUsageBytes < 8<<20 || st.Pids < 1 || st.CPUUsageNanos == 0 {
		t.Errorf("Stats(%s) = %+v, want ≥ 8 MiB, ≥ 1 pid, some CPU", ctr, st)
	}
	if pst, err := m.Stats(pod); err != nil || pst.MemoryUsageBytes < st.MemoryUsageBytes/2 {
		t.Errorf("Stats(%s) = %+v, %v: the pod counts its container", pod, pst, err)
	}
	if oom, err := m.OOMKilled(ctr); err != nil || oom {
		t.Errorf("OOMKilled(%s) before any OOM = %v, %v", ctr, oom, err)
	}

	// A container killed by its limit: memory.events of its scope and slice.
	a := startHelper(t, "alloc")
	octr := m.ContainerCgroupsPath(pod, "oom")
	startScope(t, m, octr, a.cmd.Process.Pid, &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 8 << 20, MemorySwapLimitInBytes: 8 << 20})
	oomDir := filepath.Join(podDir, "berth-oom.scope")
	checkFiles(t, oomDir, map[string]string{"memory.max": strconv.Itoa(8 << 20)})
	a.start(t)
	a.waitOOMKilled(t, "(alloc in the oom scope)")
	// The scope may be gone already (its only process died): the slice keeps the count.
	if oom, err := m.OOMKilled(pod); err != nil || !oom {
		t.Errorf("OOMKilled(%s) = %v, %v", pod, oom, err)
	}
	// systemd removes the scope once its last process is gone, which can
	// happen between any look and the read; only a scope still there must
	// report the kill.
	if oom, err := m.OOMKilled(octr); errors.Is(err, fs.ErrNotExist) && !exists(oomDir) {
		t.Logf("the oom scope went away with its process (%v)", err)
	} else if err != nil || !oom {
		t.Errorf("OOMKilled(%s) = %v, %v", octr, oom, err)
	}

	// Removal: refused while a process is in the slice, then the slice goes.
	if err := m.RemovePod(pod); err == nil {
		t.Error("RemovePod with a process in a scope succeeded")
	}
	_ = h.cmd.Process.Kill()
	<-h.exited
	for _, s := range []string{"berth-c1.scope", "berth-oom.scope"} {
		_ = exec.Command("systemctl", "stop", s).Run()
	}
	if err := m.RemovePod(pod); err != nil {
		t.Fatal(err)
	}
	if exists(podDir) {
		t.Errorf("pod slice cgroup %s left behind", podDir)
	}
	if got := unitProp(t, pod, "ActiveState"); got == "active" {
		t.Errorf("%s still active after RemovePod", pod)
	}
}

// TestSystemdDefaultPodSlice: without a cgroup_parent (crictl) the pod goes
// into berth's own slice, berth-pod<uid>.slice in berth.slice.
func TestSystemdDefaultPodSlice(t *testing.T) {
	m := requireSystemdVM(t)
	t.Cleanup(func() { _ = exec.Command("systemctl", "stop", "berth.slice").Run() })
	pod := m.PodCgroup("", "ab-12")
	if pod != "berth-podab_12.slice" {
		t.Fatalf("PodCgroup without parent = %q", pod)
	}
	if err := m.CreatePod(pod, nil); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(defaultRoot, "berth.slice", pod)
	if !exists(dir) {
		t.Fatalf("no cgroup %s", dir)
	}
	if err := m.RemovePod(pod); err != nil {
		t.Fatal(err)
	}
	if exists(dir) {
		t.Errorf("%s left behind", dir)
	}
}
