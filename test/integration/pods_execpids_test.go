package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// pidsFile is the path of a pids controller file of cgroup rel: in the pids
// hierarchy on v1, in the unified tree on v2 (for writing; cgroupFile reads).
func pidsFile(rel, name string) string {
	if cgroupV2() {
		return filepath.Join("/sys/fs/cgroup", rel, name)
	}
	return filepath.Join("/sys/fs/cgroup/pids", rel, name)
}

// pidsCount reads a number from a pids controller file of cgroup rel.
func pidsCount(t *testing.T, rel, name string) int {
	t.Helper()
	n, err := strconv.Atoi(cgroupFile(t, "pids", rel, name))
	if err != nil {
		t.Fatalf("%s of %s: %v", name, rel, err)
	}
	return n
}

// cgroupProcs are the processes in cgroup rel (its pids hierarchy on v1).
func cgroupProcs(t *testing.T, rel string) []int {
	t.Helper()
	var pids []int
	for f := range strings.FieldsSeq(cgroupFile(t, "pids", rel, "cgroup.procs")) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// TestExecAtPidsLimit: an exec into a pod at its pids limit (the kubelet's
// pod pids limit, pids.max of the pod cgroup) fails as the container's own
// forks do, with ResourceExhausted naming the limit, and leaves nothing:
// the pod's process count and the container's processes are as before, and
// once two of its processes exit (an exec takes two: berth-exec-init and
// the command) the next exec runs.
//
// On cgroup v2 it proves the exec init is cloned into the container's
// cgroup (CLONE_INTO_CGROUP), not moved there: the limit refuses a clone
// into the cgroup, which the error names, while a move (a write to
// cgroup.procs) is not refused and would take the pod above its limit; on
// kernels with pids.peak (Debian's 6.1 of the VM tier has it), the pod's
// count never went above it.
// On cgroup v1, which has no such clone, the exec init moves itself in and
// its fork is what the limit refuses: for that moment the pod holds one
// process more than its limit (pids.peak shows it), the exec init, which
// runs nothing of the container's; the command never starts.
func TestExecAtPidsLimit(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath}})
	cfg := e.podConfig("pids-limit")
	pod := e.runPod(t, cfg)
	// The container's shell and children sleeping beside it, started by
	// its own forks (no subshell: nothing transient), well above what the
	// container's start took for a moment. The shell waits for them, so
	// that one killed is reaped: a zombie counts against the limit.
	const children = 30
	cc := e.ctrConfig("full", "/bin/sh", "-c",
		"i=0; while [ $i -lt "+strconv.Itoa(children)+" ]; do sleep 100000 & i=$((i+1)); done; wait")
	id := e.runContainer(t, pod, cfg, cc)
	podCg := cfg.Linux.CgroupParent
	ctrCg := filepath.Join(podCg, id)
	if !eventually(20*time.Second, func() bool { return pidsCount(t, ctrCg, "pids.current") == children+1 }) {
		t.Fatalf("the container holds %d processes, want %d", pidsCount(t, ctrCg, "pids.current"), children+1)
	}
	limit := pidsCount(t, podCg, "pids.current")
	if err := os.WriteFile(pidsFile(podCg, "pids.max"), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, peakErr := os.Stat(pidsFile(podCg, "pids.peak"))
	hasPeak := peakErr == nil
	if hasPeak {
		if peak := pidsCount(t, podCg, "pids.peak"); peak != limit {
			t.Fatalf("the pod's pids.peak is %d before the exec, want its count %d (a start took more for a moment)", peak, limit)
		}
	} else {
		t.Logf("this kernel has no pids.peak: the pod's count is checked after the exec only")
	}
	before := cgroupProcs(t, ctrCg)

	_, err := e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"/bin/true"}, Timeout: 10})
	// On v2 the kernel refuses the clone into the container's cgroup; on v1
	// the exec init's fork there.
	refused := "fork"
	if cgroupV2() {
		refused = "clone into its cgroup"
	}
	assertCode(t, err, one(codes.ResourceExhausted), "the container's pids limit is reached, or its pod's, or the node's process limit", refused)
	t.Logf("the exec at the limit: %v", err)
	if !eventually(10*time.Second, func() bool { return pidsCount(t, podCg, "pids.current") == limit }) {
		t.Errorf("the pod holds %d processes after the refused exec, want %d", pidsCount(t, podCg, "pids.current"), limit)
	}
	if after := cgroupProcs(t, ctrCg); !slices.Equal(after, before) {
		t.Errorf("the container's processes after the refused exec: %v, want %v", after, before)
	}
	if hasPeak {
		peak := pidsCount(t, podCg, "pids.peak")
		switch {
		case cgroupV2() && peak != limit:
			t.Errorf("the pod's pids.peak is %d, above its limit %d: the exec init was moved into the container's cgroup, not cloned", peak, limit)
		case !cgroupV2() && peak != limit+1:
			t.Errorf("cgroup v1: the pod's pids.peak is %d, want %d (the exec init moves itself in, then its fork is refused)", peak, limit+1)
		}
	}

	// Two of the container's processes exit: the next exec runs.
	init := e.ctrPID(t, id)
	var killed int
	for _, pid := range before {
		if pid != init && killed < 2 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if !eventually(10*time.Second, func() bool { return pidsCount(t, podCg, "pids.current") == limit-2 }) {
		t.Fatalf("the pod holds %d processes once two were killed, want %d", pidsCount(t, podCg, "pids.current"), limit-2)
	}
	if got := e.exec(t, id, "echo", "ran"); got.code != 0 || got.stdout != "ran\n" {
		t.Errorf("the exec once two processes exited: %+v, want it to print ran", got)
	}
	if n := pidsCount(t, podCg, "pids.current"); n != limit-2 {
		t.Errorf("the pod holds %d processes after the exec, want %d", n, limit-2)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
