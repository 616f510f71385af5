package cgroups

import (
	"strings"
	"testing"
	"time"
)

// Freeze freezes a container's cgroup, the process in it with it, and
// thaws it: the freezer says FROZEN (v1) or frozen 1 (v2) once Freeze
// returns, and after the thaw the process runs again (it reads its stdin's
// end and exits).
func TestFreeze(t *testing.T) {
	m, parent := realManager(t)
	pod := m.PodCgroup(parent+"/podf", "f")
	if err := m.CreatePod(pod, nil); err != nil {
		t.Fatal(err)
	}
	ctr := m.ContainerCgroupsPath(pod, "c1")
	if err := m.create(ctr, nil, 0); err != nil {
		t.Fatal(err)
	}
	h := startHelper(t, "hold")
	moveTo(t, m, ctr, h.cmd.Process.Pid)
	h.start(t)
	if line, err := h.out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	state := func() string {
		if m.Mode() == V1 {
			return strings.TrimSpace(mountFile(t, m, "freezer", ctr, "freezer.state"))
		}
		return mountFile(t, m, "", ctr, "cgroup.events")
	}
	if err := m.Freeze(ctr, true); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "FROZEN" && !strings.Contains(got, "frozen 1") {
		t.Errorf("after Freeze: %q, want it frozen", got)
	}
	if err := m.Freeze(ctr, false); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "THAWED" && !strings.Contains(got, "frozen 0") {
		t.Errorf("after the thaw: %q, want it thawed", got)
	}
	h.stdin.Close()
	select {
	case <-h.exited:
	case <-time.After(time.Minute):
		t.Fatal("the thawed helper does not exit at its stdin's end")
	}
	if h.err != nil {
		t.Errorf("helper: %v", h.err)
	}
	if err := m.Freeze(m.ContainerCgroupsPath(pod, "none"), true); err == nil {
		t.Error("Freeze of a cgroup that does not exist: no error")
	}
	if err := m.RemovePod(pod); err != nil {
		t.Error(err)
	}
}
