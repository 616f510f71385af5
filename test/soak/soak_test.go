package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

const (
	// settleTimeout bounds how long the counts get to come back to their
	// baseline once the churn stops: berthd's collector runs within a
	// second of a removal, and the streaming server closes an ended
	// stream's connection at once.
	settleTimeout = time.Minute
	// execSyncWorkers and streamWorkers are the ExecSync calls and the
	// streams (execs, attaches) in flight beside the pod cycles.
	execSyncWorkers = 3
	streamWorkers   = 1
)

// TestSoak churns one berthd (see the package comment), sampling it before,
// after every round and after the churn, prints the samples and each
// figure's growth per 1,000 cycles, and fails on a count that does not come
// back to its baseline, on growth beyond a figure's bound, or on any call
// that did not do what it should.
func TestSoak(t *testing.T) {
	harness.RequireEnv(t, "BERTH_SOAK")
	size := sizesFromEnv(t)
	e := startSoakEnv(t, size.inFlight)
	fmt.Printf("soak: %d pod cycles (%d in flight), %d ExecSync, %d streaming execs, %d attaches, in %d rounds\n",
		size.cycles, size.inFlight, size.execSync, size.execs, size.attaches, size.rounds)

	r, err := e.startResident(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The warm-up runs every outcome once and fills berthd's caches and
	// pools, and the Go heaps their first size, so that the baseline is a
	// running node's, not a fresh one's.
	warm := work{cycles: 10, execSync: 100, execs: 4, attaches: 4}
	if err := e.round(t.Context(), r, size.inFlight, warm, work{}, "warm-"); err != nil {
		t.Fatal(err)
	}
	baseline := e.quiet(t, r, 0)
	baseline.churnShimRSS, baseline.churnShimFDs = e.tally.takeShims()
	e.tally = tally{} // the warm-up's calls are not the soak's
	fmt.Println(sampleLine("baseline", baseline))

	samples := []sample{baseline}
	start := time.Now()
	var done work
	for i := 1; i <= size.rounds; i++ {
		next := size.share(i)
		if err := e.round(t.Context(), r, size.inFlight, next.minus(done), done, ""); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		done = next
		s := e.take(done.cycles, r)
		s.churnShimRSS, s.churnShimFDs = e.tally.takeShims()
		fmt.Println(sampleLine(fmt.Sprintf("round-%d", i), s))
		samples = append(samples, s)
	}
	took := time.Since(start)
	after := e.settle(t, r, baseline, done.cycles)
	fmt.Println(sampleLine("after", after))
	fmt.Printf("soak: %d cycles, %d ExecSync, %d execs, %d attaches in %s (%.1f cycles/s)\n",
		done.cycles, done.execSync, done.execs, done.attaches, took.Round(time.Second), float64(done.cycles)/took.Seconds())

	e.tally.printLatencies()
	report(t, baseline, samples, after)
	e.removeResident(t, r)
}

// work counts what a round (or the soak so far) does.
type work struct{ cycles, execSync, execs, attaches int }

// share is the work of the first i rounds: round i's end as a share of the
// whole.
func (s sizes) share(i int) work {
	part := func(total int) int { return total * i / s.rounds }
	return work{part(s.cycles), part(s.execSync), part(s.execs), part(s.attaches)}
}

func (w work) minus(o work) work {
	return work{w.cycles - o.cycles, w.execSync - o.execSync, w.execs - o.execs, w.attaches - o.attaches}
}

// round does w, numbering its items from offset on: the pod cycles
// inFlight at a time, beside them the ExecSync calls, the streaming execs
// and the attaches. The first failure stops the round and is returned.
func (e *soakEnv) round(ctx context.Context, r resident, inFlight int, w, offset work, prefix string) error {
	g, ctx := errgroup.WithContext(ctx)
	pool := func(workers, from, n int, do func(ctx context.Context, slot, i int) error) {
		next := make(chan int)
		g.Go(func() error {
			defer close(next)
			for i := from; i < from+n; i++ {
				select {
				case next <- i:
				case <-ctx.Done():
					return nil
				}
			}
			return nil
		})
		for slot := range workers {
			g.Go(func() error {
				for i := range next {
					if err := do(ctx, slot, i); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	pool(inFlight, offset.cycles, w.cycles, func(ctx context.Context, slot, i int) error { return e.cycle(ctx, prefix, slot, i) })
	pool(execSyncWorkers, offset.execSync, w.execSync, func(ctx context.Context, _, i int) error { return e.execSync(ctx, r, i) })
	pool(streamWorkers, offset.execs, w.execs, func(ctx context.Context, _, i int) error { return e.streamExec(ctx, r, i) })
	pool(streamWorkers, offset.attaches, w.attaches, func(ctx context.Context, _, i int) error { return e.streamAttach(ctx, r, i) })
	return g.Wait()
}

// quiet samples until two samples a second apart hold the same counts (the
// warm-up's last removals collected, its streams' connections closed), at
// most settleTimeout, and returns the last.
func (e *soakEnv) quiet(t *testing.T, r resident, cycles int) sample {
	t.Helper()
	prev := e.take(cycles, r)
	for deadline := time.Now().Add(settleTimeout); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		s := e.take(cycles, r)
		if sameCounts(prev, s) {
			return s
		}
		prev = s
	}
	t.Fatalf("berthd did not settle within %s after the warm-up:\n%s", settleTimeout, sampleLine("last", prev))
	return prev
}

func sameCounts(a, b sample) bool {
	for _, f := range figures {
		if f.returns && f.get(a) != f.get(b) {
			return false
		}
	}
	return true
}

// settle samples until every count is back at its baseline (or below), at
// most settleTimeout, and returns the last sample.
func (e *soakEnv) settle(t *testing.T, r resident, baseline sample, cycles int) sample {
	t.Helper()
	s := e.take(cycles, r)
	for deadline := time.Now().Add(settleTimeout); len(grown(baseline, s)) > 0 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		s = e.take(cycles, r)
	}
	return s
}

// grown lists the counts of s above baseline.
func grown(baseline, s sample) []figure {
	var out []figure
	for _, f := range figures {
		if f.returns && f.get(s) > f.get(baseline) {
			out = append(out, f)
		}
	}
	return out
}

// report prints every figure (baseline, the most during the churn, after,
// and growth per 1,000 cycles) and fails t on a leak, a growth beyond its
// bound, or a figure that could not be read.
func report(t *testing.T, baseline sample, samples []sample, after sample) {
	t.Helper()
	cycles := samples[len(samples)-1].cycles
	fmt.Printf("soak %-30s %10s %10s %10s %14s  %s\n", "figure", "baseline", "max", "after", "per 1k cycles", "check")
	for _, f := range figures {
		most := f.get(baseline)
		for _, s := range samples {
			most = max(most, f.get(s))
		}
		slope := slopePerKilo(samples, f.get)
		check := ""
		switch {
		case f.returns:
			check = "returns to baseline"
		case f.growth != nil:
			check = fmt.Sprintf("grows < %s per 1k cycles or < %s in all", num(f.growth.perKilo), num(f.growth.floor))
		}
		fmt.Printf("soak %-30s %10s %10s %10s %+14.2f  %s\n", f.name, num(f.get(baseline)), num(most), num(f.get(after)), slope, check)
		if g := f.growth; g != nil {
			if whole := slope * float64(cycles) / 1000; slope > g.perKilo && whole > g.floor {
				t.Errorf("%s grows %.2f per 1,000 cycles, %.2f over the %d cycles; bound %s per 1,000 cycles or %s in all (%s)",
					f.name, slope, whole, cycles, num(g.perKilo), num(g.floor), g.why)
			}
		}
	}
	for _, f := range grown(baseline, after) {
		t.Errorf("leak: %s is %s after the churn (given up to %s to settle), %s at the baseline",
			f.name, num(f.get(after)), settleTimeout, num(f.get(baseline)))
	}
	for _, s := range append(slices.Clone(samples), after) {
		for _, err := range s.errors {
			t.Errorf("sample at %d cycles: %s", s.cycles, err)
		}
	}
}

// startSoakEnv starts a registry and a berthd (metrics on, for its
// goroutine count; info logs, as a node runs it) and pulls the busybox
// test image.
func startSoakEnv(t *testing.T, inFlight int) *soakEnv {
	t.Helper()
	reg := harness.NewRegistry(t)
	d := harness.StartDaemon(t, harness.Options{
		ConfigTOML: harness.PlainHTTP(reg.Host()) + "[metrics]\naddress = \"127.0.0.1:0\"\n",
		Args:       []string{"--log-level", "info"},
	})
	if d.MetricsAddr() == "" {
		t.Fatalf("berthd did not log its metrics address:\n%s", d.Logs())
	}
	ports, err := freePorts(inFlight)
	if err != nil {
		t.Fatal(err)
	}
	e := &soakEnv{d: d, logs: t.TempDir(), parent: "berth-soak-" + filepath.Base(d.State), ports: ports}
	// Registered after the daemon's own cleanups, so it runs before them.
	t.Cleanup(func() { e.teardown(t) })
	p := reg.Push(t, "berth/busybox:soak", harness.BusyboxImage(t, harness.ImageSpec{}))
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	resp, err := d.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: p.Name}})
	if err != nil {
		t.Fatalf("PullImage(%s): %v", p.Name, err)
	}
	e.image = resp.ImageRef
	return e
}

// shimPID is the PID a pod's shim recorded, 0 when it has none.
func (e *soakEnv) shimPID(pod string) int {
	b, err := os.ReadFile(filepath.Join(e.d.State, "pods", pod, "shim.pid"))
	if err != nil {
		return 0
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	return pid
}

// removeResident removes the long-lived pod and checks that berthd then
// holds no shim, cgroup, veth or lease at all.
func (e *soakEnv) removeResident(t *testing.T, r resident) {
	t.Helper()
	if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: r.pod}); err != nil {
		t.Fatalf("StopPodSandbox resident: %v", err)
	}
	if _, err := e.d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: r.pod}); err != nil {
		t.Fatalf("RemovePodSandbox resident: %v", err)
	}
	veths, err := harness.BridgePorts(e.d.Bridge())
	if err != nil {
		t.Fatal(err)
	}
	shims, cgroups := e.d.ShimPIDs(), harness.CgroupDirsUnder(e.parent)
	leases := harness.FilesUnder(filepath.Join(e.d.Root, "network", "leases"))
	if len(shims) != 0 || len(cgroups) != 0 || veths != 0 || leases != 0 {
		t.Errorf("with no pod left: shims %v, cgroups %v, %d veths, %d leases; want none", shims, cgroups, veths, leases)
	}
}

// teardown is best effort, for a soak that failed half way: it removes the
// pods left, stops berthd, unmounts the private bind mount berthd made of
// STATE/pods (so that the state folder can be removed) and removes the
// soak's cgroup parent.
func (e *soakEnv) teardown(t *testing.T) {
	if e.d.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if list, err := e.d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range list.Items {
				if _, err := e.d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
					t.Logf("teardown: remove pod %s: %v", p.Id, err)
				}
			}
		}
		e.d.Stop()
	}
	unix.Unmount(filepath.Join(e.d.State, "pods"), unix.MNT_DETACH)
	harness.RemoveCgroupTree(e.parent)
}
