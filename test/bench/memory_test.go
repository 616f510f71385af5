package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// TestMemoryPerPod holds BERTH_BENCH_PODS pods (50 unless set) of one
// sleeping container and prints what each of berth's processes costs, by
// smaps_rollup: berthd, the per-pod shims (sum, and one shim's anonymous
// and file pages), the pods' other processes, and the totals per pod that
// TestCompareContainerd's memory rows compare; then the pod start,
// ExecSync and teardown p50 that the shim's design moves. berth only: the
// containerd side is TestCompareContainerd's.
func TestMemoryPerPod(t *testing.T) {
	d, img := daemonWithBusybox(t)
	ctx := t.Context()
	n := pods
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_PODS")); err == nil && v > 0 {
		n = v
	}
	parent := fmt.Sprintf("/berth-mem-%d", os.Getpid())
	t.Cleanup(func() { removeCgroupTree(parent) })
	daemonCPUBefore := cpuSeconds(d.PID())
	ids := make([]string, n)
	var firstCtr string
	var starts []time.Duration
	for i := range ids {
		begin := time.Now()
		pod, ctr, err := startPod(ctx, d.Runtime, parent, fmt.Sprint("mem-", i), img)
		starts = append(starts, time.Since(begin))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = pod
		if i == 0 {
			firstCtr = ctr
		}
	}
	daemonCPU := cpuSeconds(d.PID()) - daemonCPUBefore
	printStartCPU(n, daemonCPU, shimPIDs(d), podProcesses(parent, true))
	var execTimes []time.Duration
	for range execs {
		begin := time.Now()
		resp, err := d.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: firstCtr, Cmd: []string{"/bin/true"}, Timeout: 10})
		if err != nil || resp.ExitCode != 0 {
			t.Fatalf("ExecSync(true) = %v, %v", resp, err)
		}
		execTimes = append(execTimes, time.Since(begin))
	}
	time.Sleep(3 * time.Second) // the shims give back what their peaks took

	shims := shimPIDs(d)
	others := podProcesses(parent, false)
	row := func(name string, pids []int) (pss int) {
		pss, rss := sumKB(pids, "Pss:"), sumKB(pids, "Rss:")
		anon, pssFile := sumKB(pids, "Anonymous:"), sumKB(pids, "Pss_File:")
		fmt.Printf("memory %-22s %4d processes: PSS %7d KB (file %6d), RSS %7d KB, anonymous %7d KB; per pod PSS %.2f MiB, RSS %.2f MiB\n",
			name, len(pids), pss, pssFile, rss, anon, float64(pss)/1024/float64(n), float64(rss)/1024/float64(n))
		return pss
	}
	row("berthd", []int{d.PID()})
	row("shims", shims)
	if len(shims) > 1 {
		row("one shim", shims[:1])
		row("another shim", shims[1:2])
		printAnonymous("another shim", shims[1])
	}
	row("pods' other processes", others)
	all := append(append([]int{d.PID()}, shims...), others...)
	row("total", all)

	var teardowns []time.Duration
	for _, id := range ids {
		begin := time.Now()
		if _, err := d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
		teardowns = append(teardowns, time.Since(begin))
	}
	fmt.Printf("memory %d pods; pod start p50 %s; ExecSync(true) p50 %s; teardown p50 %s\n", n, pct(starts, 50), pct(execTimes, 50), pct(teardowns, 50))
}

// shimPIDs are berth's processes other than berthd: the shims, and a
// helper serving execs while it lives (each names its pod's folder).
func shimPIDs(d *harness.Daemon) []int {
	var shims []int
	for _, pid := range pidsWithArg(d.State) {
		if pid != d.PID() {
			shims = append(shims, pid)
		}
	}
	return shims
}

// printStartCPU prints the CPU that starting n pods took, per pod and per
// process: berthd's (its CPU over the starts), the shims' own, what the
// shims reaped (the helpers that created the containers), and the
// containers' (their init, libcontainer's in berth-shim-helper, before it
// exec'd the workload, which has not run since: it sleeps).
func printStartCPU(n int, daemon float64, shims, containers []int) {
	var own, reaped, inits float64
	for _, pid := range shims {
		u, s, cu, cs := cpuTimes(pid)
		own += u + s
		reaped += cu + cs
	}
	for _, pid := range containers {
		u, s, _, _ := cpuTimes(pid)
		inits += u + s
	}
	perPod := func(sec float64) float64 { return sec * 1000 / float64(n) }
	// "pod": make bench keeps the lines of its known prefixes.
	fmt.Printf("pod start CPU, ms per pod: berthd %.1f, shim %.1f, helpers (reaped by the shim) %.1f, container init %.1f; total %.1f\n",
		perPod(daemon), perPod(own), perPod(reaped), perPod(inits), perPod(daemon+own+reaped+inits))
}

// cpuTimes are a process's user and system CPU seconds, and those of its
// children it has waited for.
func cpuTimes(pid int) (utime, stime, cutime, cstime float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, 0
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces: utime, stime, cutime and cstime are the 14th to 17th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	v := func(i int) float64 { x, _ := strconv.ParseFloat(f[i], 64); return x / clockTicks }
	return v(11), v(12), v(13), v(14)
}

// printAnonymous prints the mappings of a process that hold anonymous
// memory, with what they are where smaps names it (heap arena, thread
// stacks and the runtime's metadata are all unnamed in a Go program).
func printAnonymous(name string, pid int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return
	}
	var mapping string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			mapping = f[0]
			if len(f) > 5 {
				mapping += " " + f[5]
			}
		case len(f) == 3 && f[0] == "Anonymous:" && f[1] != "0":
			fmt.Printf("memory %s anonymous %6s KB in %s\n", name, f[1], mapping)
		}
	}
}
