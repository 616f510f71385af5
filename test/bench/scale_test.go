package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// scalePods and scaleContainers are the node TestScale fills: 250 pods of
// 2 containers, what a kubelet runs at its default maxPods with sidecars.
// BERTH_BENCH_PODS and BERTH_BENCH_CONTAINERS change them (to compare with
// numbers taken at 50 pods of 1). listCalls is how many times each list
// call is timed: the p99 of a few hundred calls follows the machine's load
// more than the code (BERTH_BENCH_LIST_CALLS changes it).
var (
	scalePods       = envInt("BERTH_BENCH_PODS", 250)
	scaleContainers = envInt("BERTH_BENCH_CONTAINERS", 2)
	listCalls       = envInt("BERTH_BENCH_LIST_CALLS", 3000)
)

// TestScale starts scalePods pods of scaleContainers running containers
// each, then prints the p50/p99 latency of ListPodSandbox, ListContainers
// and ListContainerStats (no filter: the kubelet's calls) and berthd's CPU
// time per call, the latency from a container's exit to its
// CONTAINER_STOPPED_EVENT on GetContainerEvents, and berthd's RSS.
func TestScale(t *testing.T) {
	d, img := daemonWithBusybox(t)
	ctx := t.Context()
	t.Cleanup(func() { removeCgroupTree("/berth-scale") })
	idleRSS := statusKB(t, d.PID(), "VmRSS")
	ids := startScalePods(t, d.Runtime, img)
	t.Cleanup(func() {
		for _, id := range ids {
			d.Runtime.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
			d.Runtime.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
		}
	})
	want := scalePods * scaleContainers
	calls := []struct {
		name string
		call func() (int, error)
	}{
		{"ListPodSandbox", func() (int, error) {
			r, err := d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
			return len(r.GetItems()) * scaleContainers, err
		}},
		{"ListContainers", func() (int, error) {
			r, err := d.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return len(r.GetContainers()), err
		}},
		{"ListContainerStats", func() (int, error) {
			r, err := d.Runtime.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{})
			return len(r.GetStats()), err
		}},
	}
	for _, c := range calls {
		var took []time.Duration
		cpu := cpuTime(t, d.PID())
		for range listCalls {
			begin := time.Now()
			n, err := c.call()
			took = append(took, time.Since(begin))
			if err != nil || n != want {
				t.Fatalf("%s: %d containers' worth, %v; want %d", c.name, n, err, want)
			}
		}
		cpu = cpuTime(t, d.PID()) - cpu
		fmt.Printf("scale %s, %d pods x %d containers: p50 %s, p99 %s over %d calls; berthd CPU %s a call\n",
			c.name, scalePods, scaleContainers, pct(took, 50), pct(took, 99), listCalls, (cpu / time.Duration(listCalls)).Round(time.Microsecond))
	}
	printEventLatency(t, d.Runtime, ids)
	fmt.Printf("scale rss berthd: idle %d KB, with %d pods x %d containers %d KB\n", idleRSS, scalePods, scaleContainers, statusKB(t, d.PID(), "VmRSS"))
}

// cpuTime is the CPU time process pid has used (user and system), in
// clock ticks of 10 ms: a daemon's own cost per call, which the machine's
// load changes less than it changes latencies.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's name, which ends with the last ')':
	// state is the first, utime and stime the 12th and 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// startScalePods starts the pods, 5 starts in flight.
func startScalePods(t *testing.T, rt runtimeapi.RuntimeServiceClient, img string) []string {
	ids := make([]string, scalePods)
	errs := make([]error, scalePods)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			for i := range next {
				ids[i], errs[i] = startScalePod(t.Context(), rt, i, img)
			}
		})
	}
	for i := range scalePods {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return ids
}

func startScalePod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, i int, img string) (string, error) {
	name := fmt.Sprint("scale-", i)
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: "uid-" + name},
		Linux: &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/berth-scale/" + name,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{
				Pid: runtimeapi.NamespaceMode_CONTAINER, Network: runtimeapi.NamespaceMode_NODE}}},
	}
	p, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", fmt.Errorf("RunPodSandbox: %w", err)
	}
	for j := range scaleContainers {
		c, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.PodSandboxId, SandboxConfig: cfg,
			Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprint("c", j)},
				Image: &runtimeapi.ImageSpec{Image: img}, Command: []string{"/bin/sleep", "3600"}}})
		if err != nil {
			return p.PodSandboxId, fmt.Errorf("CreateContainer: %w", err)
		}
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
			return p.PodSandboxId, fmt.Errorf("StartContainer: %w", err)
		}
	}
	return p.PodSandboxId, nil
}

// eventSamples is how many container exits printEventLatency times.
const eventSamples = 20

// printEventLatency kills one container in each of the first pods and
// times, for each, from its exit (FinishedAt, taken by the shim when it
// reaped it) to its CONTAINER_STOPPED_EVENT arriving here.
func printEventLatency(t *testing.T, rt runtimeapi.RuntimeServiceClient, pods []string) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for _, pod := range pods[:min(eventSamples, len(pods))] {
		r, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
		if err != nil || len(r.Containers) == 0 {
			t.Fatalf("ListContainers(pod %s) = %v, %v", pod, r, err)
		}
		id := r.Containers[0].Id
		if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
		for {
			ev, err := events.Recv()
			if status.Code(err) == codes.Unimplemented { // berth before GetContainerEvents
				fmt.Println("scale event latency: GetContainerEvents is unimplemented")
				return
			}
			if err != nil {
				t.Fatalf("GetContainerEvents: %v", err)
			}
			if ev.ContainerId != id || ev.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
				continue
			}
			arrived := time.Now()
			for _, cs := range ev.ContainersStatuses {
				if cs.Id == id {
					took = append(took, arrived.Sub(time.Unix(0, cs.FinishedAt)))
				}
			}
			break
		}
	}
	if len(took) == 0 {
		t.Fatal("no stopped event carried the container's status")
	}
	fmt.Printf("scale event latency (exit to CONTAINER_STOPPED_EVENT received): p50 %s, p99 %s over %d exits\n", pct(took, 50), pct(took, 99), len(took))
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
