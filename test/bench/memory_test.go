package bench

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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

	shims := []int{}
	for _, pid := range pidsWithArg(d.State) {
		if pid != d.PID() {
			shims = append(shims, pid)
		}
	}
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
	if len(shims) > 0 {
		row("one shim", shims[:1])
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
