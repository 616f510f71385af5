package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// execs is how many execs of each kind TestExecLatency times.
const execs = 50

// TestExecLatency runs /bin/true in a running container with ExecSync and
// as a streaming exec (Exec, then the URL driven over SPDY with kubectl's
// client library: connect, run, exit code) and prints the p50/p99 of both;
// then ExecSyncs apart from each other, as a kubelet's exec probes come
// (every 10 s by default); and the CPU time each ExecSync costs the runtime
// back to back and apart: berthd's, the pod's shim's and that of what the
// shim reaped (the exec inits or exec servers, and the commands below them).
func TestExecLatency(t *testing.T) {
	d, img := daemonWithBusybox(t)
	ctx := t.Context()
	t.Cleanup(func() { removeCgroupTree("/berth-bench") })
	pod, ctr, err := startPod(ctx, d.Runtime, "/berth-bench", "bench-exec", img)
	t.Cleanup(func() { // t.Context() is done by now
		d.Runtime.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod})
		d.Runtime.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod})
	})
	if err != nil {
		t.Fatal(err)
	}

	execTrue := func() time.Duration {
		begin := time.Now()
		res, err := d.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"/bin/true"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("ExecSync: %v, exit code %d", err, res.GetExitCode())
		}
		return time.Since(begin)
	}
	var syncs, streams []time.Duration
	for range execs {
		syncs = append(syncs, execTrue())

		begin := time.Now()
		resp, err := d.Runtime.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: ctr, Cmd: []string{"/bin/true"}, Stdout: true})
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(resp.Url)
		if err != nil {
			t.Fatal(err)
		}
		x, err := remotecommand.NewSPDYExecutor(&restclient.Config{}, http.MethodPost, u)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard}); err != nil {
			t.Fatalf("streaming exec: %v", err)
		}
		streams = append(streams, time.Since(begin))
	}
	fmt.Printf("exec sync (/bin/true): p50 %s, p99 %s over %d\n", pct(syncs, 50), pct(syncs, 99), execs)
	fmt.Printf("exec stream (/bin/true, spdy): p50 %s, p99 %s over %d\n", pct(streams, 50), pct(streams, 99), execs)

	// execCPU runs n ExecSyncs, gap after each other, and returns their
	// latencies and the CPU time per exec: berthd's and the shim's own
	// inside each call (what they do idle between calls, berthd's samplers,
	// is not the exec's), and all that the shim reaped meanwhile, read once
	// what served the execs has exited (the exec server lingers 2 s), and
	// from once what served the execs before has.
	shim := shimPID(t, d, pod)
	execCPU := func(n int, gap time.Duration) ([]time.Duration, float64) {
		time.Sleep(apartGap)
		_, _, cu0, cs0 := cpuTimes(shim)
		var lat []time.Duration
		var own float64
		for range n {
			time.Sleep(gap)
			before := cpuSeconds(d.PID()) + cpuSeconds(shim)
			lat = append(lat, execTrue())
			own += cpuSeconds(d.PID()) + cpuSeconds(shim) - before
		}
		time.Sleep(apartGap)
		_, _, cu, cs := cpuTimes(shim)
		return lat, (own + cu - cu0 + cs - cs0) / float64(n)
	}
	_, backToBack := execCPU(execs, 0)
	apart, apartCPU := execCPU(apartExecs, apartGap)
	fmt.Printf("exec sync apart (/bin/true, %s after the last): p50 %s, p99 %s over %d\n", apartGap, pct(apart, 50), pct(apart, 99), apartExecs)
	fmt.Printf("exec sync CPU per exec (berthd, the shim and what it reaped): back to back %.1f ms, %s apart %.1f ms\n",
		backToBack*1000, apartGap, apartCPU*1000)
}

// apartExecs ExecSyncs apartGap after each other: longer than the shim
// keeps the exec server (sandbox/shim/server's execLinger, 2 s).
const (
	apartExecs = 8
	apartGap   = 3 * time.Second
)
