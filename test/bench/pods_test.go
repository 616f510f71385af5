package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// pods is how many pods the pod benchmarks start.
const pods = 50

// TestPodStartAndTeardown starts 50 pods one after another, each with one
// running container of an image already pulled, then tears them down, and
// prints pod start (RunPodSandbox + CreateContainer + StartContainer) and
// teardown (StopPodSandbox + RemovePodSandbox) p50/p99, the mean of each
// start step, the RSS of berthd (idle and with 50 pods), and the RSS,
// anonymous memory and threads of one shim.
func TestPodStartAndTeardown(t *testing.T) {
	d, img := daemonWithBusybox(t)
	ctx := t.Context()
	t.Cleanup(func() {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/berth-bench")
		for _, dir := range dirs {
			os.Remove(dir)
		}
	})
	idleRSS := statusKB(t, d.PID(), "VmRSS")

	var starts, teardowns []time.Duration
	steps := map[string]time.Duration{}
	ids := make([]string, 0, pods)
	for i := range pods {
		begin := time.Now()
		pod, ctr, err := startPod(ctx, d.Runtime, "/berth-bench", fmt.Sprint("bench-", i), img)
		if err != nil {
			t.Fatal(err)
		}
		starts = append(starts, time.Since(begin))
		ids = append(ids, pod)
		st, err := d.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		addTimeline(t, "pod ", st.Info, steps)
		cs, err := d.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ctr, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		addTimeline(t, "container ", cs.Info, steps)
	}
	busyRSS := statusKB(t, d.PID(), "VmRSS")
	// The first pod's shim has idled longest: what a shim settles at.
	shim := shimPID(t, d, ids[0])
	shimRSS, shimAnon, shimThreads := statusKB(t, shim, "VmRSS"), statusKB(t, shim, "RssAnon"), statusKB(t, shim, "Threads")

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

	fmt.Printf("pod start (run+create+start, image present): p50 %s, p99 %s over %d pods\n", pct(starts, 50), pct(starts, 99), pods)
	fmt.Printf("teardown (stop+remove): p50 %s, p99 %s over %d pods\n", pct(teardowns, 50), pct(teardowns, 99), pods)
	names := make([]string, 0, len(steps))
	for name := range steps {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Printf("step %-20s mean %s\n", name, (steps[name] / pods).Round(10*time.Microsecond))
	}
	fmt.Printf("rss berthd: idle %d KB, with %d pods %d KB; one shim %d KB (anonymous %d KB, %d threads)\n",
		idleRSS, pods, busyRSS, shimRSS, shimAnon, shimThreads)
}

// addTimeline adds the start steps in a verbose status's info to sums,
// their names prefixed.
func addTimeline(t *testing.T, prefix string, verbose map[string]string, sums map[string]time.Duration) {
	t.Helper()
	var info struct {
		Timeline []struct {
			Name     string
			Duration time.Duration
		}
	}
	if err := json.Unmarshal([]byte(verbose["info"]), &info); err != nil {
		t.Fatal(err)
	}
	for _, s := range info.Timeline {
		sums[prefix+s.Name] += s.Duration
	}
}

// daemonWithBusybox starts berthd with the busybox image pulled.
func daemonWithBusybox(t *testing.T) (*harness.Daemon, string) {
	harness.RequireEnv(t, "BERTH_BENCH")
	reg := harness.NewRegistry(t)
	p := reg.Push(t, "bench/busybox:1", harness.BusyboxImage(t, harness.ImageSpec{}))
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host())})
	if _, err := d.Images.PullImage(t.Context(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: p.Name}}); err != nil {
		t.Fatal(err)
	}
	return d, p.Name
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(10 * time.Microsecond)
}

// statusKB reads a number field of a process's status: VmRSS and RssAnon
// in KB, Threads.
func statusKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatalf("no %s for %d", field, pid)
	return 0
}

func shimPID(t *testing.T, d *harness.Daemon, pod string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.State, "pods", pod, "shim.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
