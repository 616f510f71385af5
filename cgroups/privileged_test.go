package cgroups

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// realManager returns a cgroupfs Manager on the host's real cgroups and a
// fresh test parent ("/berth-test-…") that is removed from every hierarchy
// when the test ends, whatever happened.
func realManager(t *testing.T) (*Manager, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	m, err := New(Cgroupfs)
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("/berth-test-%d-%x", os.Getpid(), rand.Uint32())
	t.Cleanup(func() {
		for _, d := range m.dirs(parent) {
			if err := cgroups.RemovePath(d); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return m, parent
}

// helper starts the test binary in a helper mode; it waits for start()
// before doing anything, so that it can first be moved into a cgroup by PID.
// It is killed at the end of the test if still running.
type helper struct {
	cmd    *exec.Cmd
	stdin  *os.File
	out    *bufio.Reader
	exited chan struct{} // closed when err is set
	err    error
}

func startHelper(t *testing.T, mode string) *helper {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	_ = outR.SetReadDeadline(time.Now().Add(time.Minute)) // a stuck helper fails the test, not the run
	h := &helper{cmd: cmd, stdin: inW, out: bufio.NewReader(outR), exited: make(chan struct{})}
	go func() {
		h.err = cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-h.exited
		inW.Close()
		outR.Close()
	})
	return h
}

func (h *helper) start(t *testing.T) {
	t.Helper()
	if _, err := h.stdin.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
}

// waitOOMKilled waits for the helper to exit and checks that the kernel
// killed it (SIGKILL); detail says more on failure.
func (h *helper) waitOOMKilled(t *testing.T, detail string) {
	t.Helper()
	select {
	case <-h.exited:
	case <-time.After(time.Minute):
		t.Fatal("helper neither died nor finished")
	}
	if ws, _ := h.cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("helper: %v %s, want killed by SIGKILL", h.err, detail)
	}
}

// moveTo puts pid into the cgroup in every hierarchy, as runc does for a container.
func moveTo(t *testing.T, m *Manager, cgroupPath string, pid int) {
	t.Helper()
	rel, err := m.fsPath(cgroupPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.dirs(rel) {
		if err := cgroups.WriteCgroupProc(d, pid); err != nil {
			t.Fatal(err)
		}
	}
}

// mountFile reads a file of the cgroup rel in the hierarchy of controller.
func mountFile(t *testing.T, m *Manager, controller, rel, file string) string {
	t.Helper()
	dir := filepath.Join(m.root, rel)
	if m.mode == V1 {
		mnt, ok := m.hier[controller]
		if !ok {
			t.Fatalf("no %s hierarchy", controller)
		}
		dir = filepath.Join(mnt, rel)
	}
	return readFile(t, filepath.Join(dir, file))
}

func TestPodLifecycle(t *testing.T) {
	m, parent := realManager(t)
	t.Logf("mode %v, hierarchies %v, caps %+v", m.Mode(), m.hier, m.caps)
	pod := m.PodCgroup(parent+"/podu1", "u1")
	res := &runtimeapi.LinuxContainerResources{
		CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000,
		MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 64 << 20, CpusetCpus: "0", CpusetMems: "0",
	}
	if err := m.CreatePod(pod, res); err != nil {
		t.Fatal(err)
	}
	if err := m.CreatePod(pod, res); err != nil {
		t.Fatalf("second CreatePod: %v", err)
	}
	for _, d := range m.dirs(pod) {
		if !exists(d) {
			t.Errorf("%s missing", d)
		}
	}
	want := map[[2]string]string{ // controller, file → value
		{"cpuset", "cpuset.cpus"}: "0", {"cpuset", "cpuset.mems"}: "0",
	}
	if m.Mode() == V1 {
		want[[2]string{"cpu", "cpu.shares"}] = "512"
		want[[2]string{"cpu", "cpu.cfs_quota_us"}] = "50000"
		want[[2]string{"cpu", "cpu.cfs_period_us"}] = "100000"
		want[[2]string{"memory", "memory.limit_in_bytes"}] = strconv.Itoa(64 << 20)
		if m.caps.swap {
			want[[2]string{"memory", "memory.memsw.limit_in_bytes"}] = strconv.Itoa(64 << 20)
		}
	} else {
		want[[2]string{"cpu", "cpu.weight"}] = strconv.FormatUint(SharesToWeight(512), 10)
		want[[2]string{"cpu", "cpu.max"}] = "50000 100000"
		want[[2]string{"memory", "memory.max"}] = strconv.Itoa(64 << 20)
		if m.caps.swap {
			want[[2]string{"memory", "memory.swap.max"}] = "0"
		}
	}
	for k, v := range want {
		if got := mountFile(t, m, k[0], pod, k[1]); got != v {
			t.Errorf("%s %s = %q, want %q", k[0], k[1], got, v)
		}
	}

	// A container cgroup made as runc would make it, with a pids limit.
	ctr := m.ContainerCgroupsPath(pod, "c1")
	if err := m.create(ctr, &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}, 64); err != nil {
		t.Fatal(err)
	}
	if got := mountFile(t, m, "pids", ctr, "pids.max"); got != "64" {
		t.Errorf("pids.max = %q", got)
	}
	h := startHelper(t, "hold")
	moveTo(t, m, ctr, h.cmd.Process.Pid)
	h.start(t)
	if line, err := h.out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	for _, p := range []string{ctr, pod} {
		// The kernel updates a cgroup's memory.stat from its children's
		// lazily (every 2 s on Linux 6.x): the pod's counts may lag.
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, err := m.Stats(p)
			if err != nil {
				t.Fatal(err)
			}
			if st.Pids >= 1 && st.MemoryUsageBytes >= 8<<20 && st.MemoryWorkingSetBytes != 0 &&
				st.MemoryRSSBytes >= 8<<20 && st.PageFaults != 0 && st.CPUUsageNanos != 0 && st.OOMKills == 0 {
				t.Logf("Stats(%s) = %+v", p, st)
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("Stats(%s) = %+v: want the helper's pid, 8 MiB and some CPU", p, st)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// RemovePod refuses while the helper is in there, and names the cgroup.
	err := m.RemovePod(pod)
	if err == nil || !strings.Contains(err.Error(), "/c1") || !strings.Contains(err.Error(), strconv.Itoa(h.cmd.Process.Pid)) {
		t.Errorf("RemovePod with a live process: %v", err)
	}
	for _, d := range m.dirs(ctr) {
		if !exists(d) {
			t.Errorf("%s removed although RemovePod refused", d)
		}
	}

	_ = h.cmd.Process.Kill()
	<-h.exited
	if err := m.RemovePod(pod); err != nil {
		t.Fatal(err)
	}
	if err := m.RemovePod(pod); err != nil {
		t.Errorf("second RemovePod: %v", err)
	}
	assertGone(t, parent)
}

// assertGone checks every mount under /sys/fs/cgroup, independently of the
// Manager's view of them: parent may still exist but must be empty.
func assertGone(t *testing.T, parent string) {
	t.Helper()
	ents, err := os.ReadDir(defaultRoot)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			continue
		}
		dir := filepath.Join(defaultRoot, e.Name(), parent)
		if m, _ := detectMode(defaultRoot); m == V2 {
			dir = filepath.Join(defaultRoot, parent)
		}
		sub, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			t.Error(err)
		}
		for _, s := range sub {
			if s.IsDir() {
				t.Errorf("left behind: %s", filepath.Join(dir, s.Name()))
			}
		}
		checked++
	}
	if checked == 0 {
		t.Error("no cgroup mount checked")
	}
}

func TestOOMKill(t *testing.T) {
	m, parent := realManager(t)
	pod := m.PodCgroup(parent+"/podu2", "u2")
	if err := m.CreatePod(pod, nil); err != nil {
		t.Fatal(err)
	}
	ctr := m.ContainerCgroupsPath(pod, "oom")
	// No swap either, so the limit is hit rather than swapped around.
	lim := &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 8 << 20, MemorySwapLimitInBytes: 8 << 20}
	if err := m.create(ctr, lim, 0); err != nil {
		t.Fatal(err)
	}
	if oom, err := m.OOMKilled(ctr); err != nil || oom {
		t.Fatalf("OOMKilled before: %v %v", oom, err)
	}
	h := startHelper(t, "alloc")
	moveTo(t, m, ctr, h.cmd.Process.Pid)
	h.start(t)
	line, _ := h.out.ReadString('\n') // EOF when killed; a deadline error if it hangs
	h.waitOOMKilled(t, fmt.Sprintf("(output %q)", line))
	oom, err := m.OOMKilled(ctr)
	if err != nil || !oom {
		t.Errorf("OOMKilled after = %v, %v", oom, err)
	}
	if st, err := m.Stats(ctr); err != nil || st.OOMKills == 0 {
		t.Errorf("Stats after OOM: %+v %v", st, err)
	}
	if err := m.RemovePod(pod); err != nil {
		t.Fatal(err)
	}
	assertGone(t, parent)
}

// A create the kernel refuses leaves nothing behind, not even the parent it made.
func TestCreateRollback(t *testing.T) {
	m, parent := realManager(t)
	pod := m.PodCgroup(parent+"/podu3", "u3")
	err := m.CreatePod(pod, &runtimeapi.LinuxContainerResources{CpusetCpus: "4095"}) // no such CPU
	if err == nil {
		t.Fatal("CreatePod with a CPU the host lacks succeeded")
	}
	t.Log(err)
	for _, d := range m.dirs(parent) {
		if exists(d) {
			t.Errorf("left behind: %s", d)
		}
	}
}
