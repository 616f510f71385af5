package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cgroups"
)

// The probe rows (issue #36), measured by runProbes.
const (
	rowExecBackToBack = "ExecSync(true) p50, back to back"
	rowExecApart      = "ExecSync(true) p50, 3 s apart"
	rowExecProbed     = "ExecSync(true) p50, 50 pods probed every 10 s"
	rowCPUProbed      = "the same, CPU s per 1,000 execs"
	rowPSSProbed      = "the same, PSS of runtime processes / 50"
	rowStormP50       = "100 pods probed every 1 s, 5 churning: ExecSync p50"
	rowStormP99       = "the same, ExecSync p99"
	rowStormCPU       = "the same, CPU s per 1,000 execs, churn included"
	rowStormOver      = "the same, execs over 1 s (timeouts)"
)

// The probe workloads: a node's exec probes at the kubelet's default period
// (10 s), and a storm of one probe per pod and second with pods starting
// and stopping meanwhile.
const (
	backToBackExecs = 20
	probedPods      = 50
	probedPeriod    = 10 * time.Second
	probedFor       = 30 * time.Second
	stormPods       = 100
	stormPeriod     = time.Second
	stormFor        = 60 * time.Second
	churning        = 5                // pods starting and stopping at a time during the storm
	churnEvery      = 20 * time.Second // at most one pod start and removal per churning worker in this time
	probeTimeout    = 1                // ExecSync's timeout in seconds, a probe's default
)

// runProbes measures the probe rows into values on pods of its own, all
// removed when it returns: with 50 pods held, ExecSyncs back to back and 3 s
// apart in one of them, then each of the 50 probed every 10 s for 30 s; then
// with 100 held, each probed every second for 60 s while 5 pods at a time
// start and stop. The CPU rows are the runtime's CPU over the probing (its
// cgroup's: the daemon, shims, helpers and exec inits before they join a
// container, exited ones included) plus the pods' cgroups' (exec inits after
// they join, the commands, and the churning pods' containers), per 1,000
// execs.
func runProbes(t *testing.T, rt criRuntime, parent, image string, values map[string]float64) {
	ids := startPodsInFlight(t, rt, parent, image, "probe-", probedPods, 5)
	defer func() { removePodsInFlight(t, rt, ids, 5) }()
	ctrs := make([]string, len(ids))
	for i, id := range ids {
		ctrs[i] = listContainers(t, rt, id)
	}

	var backToBack, apart []time.Duration
	for range backToBackExecs {
		backToBack = append(backToBack, execTrue(t, rt, ctrs[0]))
	}
	for range apartExecs {
		time.Sleep(apartGap)
		apart = append(apart, execTrue(t, rt, ctrs[0]))
	}
	values[rowExecBackToBack], values[rowExecApart] = ms(pct(backToBack, 50)), ms(pct(apart, 50))

	cpu := runtimeCPU(t, parent)
	probed := probe(t, rt, ctrs, probedPeriod, probedFor, func() {
		values[rowPSSProbed], _ = heldMemory(rt, parent, probedPods, map[part]memUse{})
	})
	values[rowCPUProbed] = (runtimeCPU(t, parent) - cpu) / float64(len(probed.lat)) * 1000
	values[rowExecProbed] = ms(pct(probed.lat, 50))
	t.Logf("%s: %d pods probed every %s: %d execs, %d over %d s", rt.name, probedPods, probedPeriod, len(probed.lat), probed.over, probeTimeout)

	ids = append(ids, startPodsInFlight(t, rt, parent, image, "storm-", stormPods-probedPods, 5)...)
	for _, id := range ids[len(ctrs):] {
		ctrs = append(ctrs, listContainers(t, rt, id))
	}
	cpu = runtimeCPU(t, parent)
	stop := make(chan struct{})
	churned := make(chan int)
	go func() { churned <- churn(t, rt, parent, image, stop) }()
	storm := probe(t, rt, ctrs, stormPeriod, stormFor, func() {})
	close(stop)
	cycles := <-churned
	values[rowStormCPU] = (runtimeCPU(t, parent) - cpu) / float64(len(storm.lat)) * 1000
	values[rowStormP50], values[rowStormP99] = ms(pct(storm.lat, 50)), ms(pct(storm.lat, 99))
	values[rowStormOver] = float64(storm.over)
	t.Logf("%s: %d pods probed every %s with %d churning: %d execs, %d over %d s (%d failed: %v); %d pods started and removed meanwhile",
		rt.name, stormPods, stormPeriod, churning, len(storm.lat), storm.over, probeTimeout, storm.failed, storm.firstErr, cycles)
}

// execTrue runs /bin/true in ctr with ExecSync and returns how long it took.
func execTrue(t *testing.T, rt criRuntime, ctr string) time.Duration {
	begin := time.Now()
	resp, err := rt.runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"/bin/true"}, Timeout: 10})
	if err != nil || resp.ExitCode != 0 {
		t.Fatalf("%s: ExecSync(true) = %v, %v", rt.name, resp, err)
	}
	return time.Since(begin)
}

// probed is what the probes of one workload saw: each exec's latency, those
// over the probe's timeout (or failed), the failures and the first of them.
type probed struct {
	lat          []time.Duration
	over, failed int
	firstErr     error
	mu           sync.Mutex
}

// probe probes each container as a kubelet's exec probe does, every period
// (a probe still running when the next is due skips that one, as the
// kubelet's ticker drops ticks), the containers' first probes spread over
// one period, for duration, and returns once the last probe has ended. It calls midway once,
// half way through.
func probe(t *testing.T, rt criRuntime, ctrs []string, period, duration time.Duration, midway func()) *probed {
	res := &probed{}
	begin := time.Now()
	end := begin.Add(duration)
	var wg sync.WaitGroup
	for i, ctr := range ctrs {
		wg.Go(func() {
			due := begin.Add(time.Duration(i) * period / time.Duration(len(ctrs)))
			for due.Before(end) {
				time.Sleep(time.Until(due))
				res.add(probeOnce(t.Context(), rt, ctr))
				// The probes that came due meanwhile are skipped.
				for due = due.Add(period); due.Before(time.Now()); due = due.Add(period) {
				}
			}
		})
	}
	time.Sleep(time.Until(begin.Add(duration / 2)))
	midway()
	wg.Wait()
	return res
}

// probeOnce runs one exec probe, /bin/true with the probe's timeout and the
// kubelet's deadline for the call (its runtime request timeout, 2 minutes by
// default, beyond the probe's), and returns its latency and error.
func probeOnce(ctx context.Context, rt criRuntime, ctr string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute+probeTimeout*time.Second)
	defer cancel()
	begin := time.Now()
	resp, err := rt.runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"/bin/true"}, Timeout: probeTimeout})
	if err == nil && resp.ExitCode != 0 {
		err = fmt.Errorf("exit code %d, stderr %q", resp.ExitCode, resp.Stderr)
	}
	return time.Since(begin), err
}

func (p *probed) add(lat time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lat = append(p.lat, lat)
	if err != nil || lat > probeTimeout*time.Second {
		p.over++
	}
	if err != nil {
		p.failed++
		if p.firstErr == nil {
			p.firstErr = err
		}
	}
}

// churn starts and removes pods, churning at a time, each worker at most
// one pod every churnEvery, until stop is closed, and returns how many it
// started and removed. The pace is the same for both runtimes, so that the
// storm's CPU row compares the same work: unpaced, berth's workers started
// and removed 30 times containerd's pods in the minute (487–567 against
// 15–18 on a quiet machine), all of it counted in berth's CPU. A failure
// fails the test, and a pod started even in part is removed.
func churn(t *testing.T, rt criRuntime, parent, image string, stop <-chan struct{}) int {
	var cycles sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	n := 0
	for w := range churning {
		cycles.Go(func() {
			next := time.NewTimer(0)
			defer next.Stop()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-next.C:
				}
				next.Reset(churnEvery)
				pod, _, err := startPod(t.Context(), rt.runtime, parent, fmt.Sprintf("churn-%d-%d", w, k), image)
				if pod != "" {
					err = errors.Join(err, stopAndRemovePod(t.Context(), rt, pod))
				}
				mu.Lock()
				n++
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	cycles.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Errorf("%s: churning pods: %v", rt.name, err)
	}
	return n
}

// runtimeCgroup is the cgroup the bench moves a runtime's daemon into
// (its shims and helpers follow): beside the pods' parent, not below it,
// so that the pods' memory rows do not count the daemon as a pod's.
func runtimeCgroup(parent string) string { return parent + "-runtime" }

// joinCgroup moves pid into cgroup cg, made if missing: of the unified
// hierarchy (v2), or of the v1 hierarchies whose files cgroups.Manager's
// Stats reads (a new cpuset cgroup, for one, would take no process before
// its cpus and mems are set).
func joinCgroup(t *testing.T, cg string, pid int) {
	dirs := []string{filepath.Join("/sys/fs/cgroup", cg)}
	if cgroups.DetectMode() == cgroups.V1 {
		dirs = nil
		for _, h := range []string{"cpuacct", "memory", "pids"} {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", h, cg))
		}
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// runtimeCPU is the CPU seconds so far of the runtime's cgroup and of the
// pods' (exited processes and removed child cgroups included), read as
// berth reads a cgroup's.
func runtimeCPU(t *testing.T, parent string) float64 {
	m, err := cgroups.New(cgroups.Cgroupfs)
	if err != nil {
		t.Fatal(err)
	}
	var ns uint64
	for _, cg := range []string{runtimeCgroup(parent), parent} {
		st, err := m.Stats(cg)
		if err != nil {
			t.Fatalf("CPU of cgroup %s: %v", cg, err)
		}
		ns += st.CPUUsageNanos
	}
	return float64(ns) / 1e9
}
