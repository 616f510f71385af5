package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// countedRounds are the counted rounds of TestCompareContainerd, after one
// warm-up: 3, or BERTH_BENCH_ROUNDS (for a machine too loaded for three
// rounds of 250 pods in the time it has).
func countedRounds() int {
	if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// criRuntime is one runtime under comparison, started fresh for a round.
type criRuntime struct {
	name    string
	runtime runtimeapi.RuntimeServiceClient
	images  runtimeapi.ImageServiceClient
	// overheadPIDs are the runtime's own processes: the daemon and its
	// per-pod processes outside the pods' cgroups (shims).
	overheadPIDs func() []int
	// layersStored counts the unpacked layers and blobs the runtime keeps
	// on disk: 0 once a removed image's layers are gone.
	layersStored func() int
	// daemon is the daemon's PID: pulls and unpacks run in it.
	daemon int
}

// Row groups: BERTH_BENCH_ROWS names one to measure it alone.
const (
	podRows   = "pods"   // pod start, teardown, pods in flight, memory held
	pullRows  = "pull"   // the cold pulls
	probeRows = "probes" // exec probes: latency, CPU and memory under them (probes_test.go)
	// lazyRows ("lazy", lazy_test.go) are TestCompareLazy's.
)

// measures are the rows of the comparison, in the order printed, with the
// target ratio (berth / containerd): issue #26's for pods and pulls (a
// per-pod footprint near the floor), issue #36's for exec probes. A target
// of 0 is a count berth must keep at 0 (no ratio); NaN, a row without one.
// The rows at 250 pods and the probe rows are measured in the counted rounds
// only.
var measures = []struct {
	name   string
	unit   string
	target float64
	group  string
}{
	{rowStart, "ms", 0.25, podRows},
	{rowTeardown, "ms", 0.25, podRows},
	{row50InFlight, "s", 0.25, podRows},
	{row250InFlight, "s", 0.25, podRows},
	{row50PSS, "MiB", 0.33, podRows},
	{row50RSS, "MiB", 0.33, podRows},
	{row50WithContainers, "MiB", 0.33, podRows},
	{row250PSS, "MiB", 0.33, podRows},
	{row250RSS, "MiB", 0.33, podRows},
	{rowExecBackToBack, "ms", 0.20, probeRows},
	{rowExecApart, "ms", 0.20, probeRows},
	{rowExecProbed, "ms", 0.20, probeRows},
	{rowCPUProbed, "s", 0.20, probeRows},
	{rowPSSProbed, "MiB", 0.33, probeRows},
	{rowStormP50, "ms", math.NaN(), probeRows},
	{rowStormP99, "ms", math.NaN(), probeRows},
	{rowStormCPU, "s", 0.20, probeRows},
	{rowStormOver, "", 0, probeRows},
	{rowColdPull, "s", 0.33, pullRows},
	{rowHostPull, "s", 0.33, pullRows},
}

// The rows' names, which key each round's values.
const (
	rowStart            = "pod start p50, sequential (run + create + start)"
	rowTeardown         = "teardown p50 (stop + remove pod)"
	row50InFlight       = "50 pods, 5 in flight: wall"
	row250InFlight      = "250 pods, 5 in flight: wall"
	row50PSS            = "memory per pod, 50 held: PSS of runtime processes / 50"
	row50RSS            = "the same, RSS"
	row50WithContainers = "the same with the containers' own memory, PSS"
	row250PSS           = "memory per pod, 250 held: PSS of runtime processes / 250"
	row250RSS           = "the same at 250, RSS"
	rowColdPull         = "cold pull, 20 layers, 100 MiB gzip"
	rowHostPull         = "cold pull, 20 layers of host files (after RemoveImage)"
)

// manyPods is the larger node of the comparison: its start with 5 in
// flight and its memory held are the rows at 250 pods.
const manyPods = 250

// measured says whether the run measures the rows of group: all groups
// unless BERTH_BENCH_ROWS names one.
func measured(group string) bool {
	rows := os.Getenv("BERTH_BENCH_ROWS")
	return rows == "" || rows == group
}

// TestCompareContainerd (make bench-compare) runs one workload against berth
// (built-in network) and against Debian's containerd 1.6 (runc, CNI bridge
// and portmap), each on fresh folders, alternating, one warm-up round and
// three counted ones (the 250 pods in the counted ones only), and prints each measure's medians and their ratio. It
// asserts nothing: the numbers are for people and commit messages.
// BERTH_BENCH_ROWS=pods, =pull or =probes runs one group of rows alone
// (=lazy, TestCompareLazy's alone);
// BERTH_BENCH_ROUNDS sets the counted rounds.
func TestCompareContainerd(t *testing.T) {
	harness.RequireEnv(t, "BERTH_BENCH_COMPARE")
	if !measured(podRows) && !measured(pullRows) && !measured(probeRows) {
		t.Skip("BERTH_BENCH_ROWS selects another row group")
	}
	reg := harness.NewRegistry(t)
	busybox := reg.Push(t, "bench/busybox:1", harness.BusyboxImage(t, harness.ImageSpec{}))
	// containerd needs a pause image; berth has its own and needs none.
	pause := reg.Push(t, "bench/pause:1", harness.BusyboxImage(t, harness.ImageSpec{
		Config: v1.Config{Entrypoint: []string{"/bin/sleep", "2147483647"}}}))
	// The cold pull rows' images (the host tree takes most of a minute to build).
	var bigName, realName string
	if measured(pullRows) {
		bigName = reg.Push(t, "bench/pull:1", harness.NewImage(t, harness.ImageSpec{Layers: randomLayers(20, 5<<20)})).Name
		begin := time.Now()
		hostTree := harness.NewImage(t, harness.ImageSpec{Layers: hostTreeLayers(t, 20, 244<<20)})
		compressed := 0
		for _, d := range harness.LayerDigests(t, hostTree) {
			compressed += int(harness.BlobSize(t, hostTree, d))
		}
		realName = reg.Push(t, "bench/hosttree:1", hostTree).Name
		t.Logf("host tree image: 20 layers, %.1f MiB gzip, built in %s", float64(compressed)/(1<<20), time.Since(begin).Round(time.Second))
	}

	results := map[string]map[string][]float64{} // runtime → row → one value per round
	parts := map[string]map[part][]memUse{}      // runtime → process kind → one use per round
	rounds := countedRounds()
	for round := 0; round <= rounds; round++ {
		for _, name := range []string{"containerd", "berth"} {
			t.Run(fmt.Sprintf("%s/round%d", name, round), func(t *testing.T) {
				parent := fmt.Sprintf("/bench-%s-%d-%d", name, os.Getpid(), round)
				t.Cleanup(func() { removeCgroupTree(parent); removeCgroupTree(runtimeCgroup(parent)) })
				var rt criRuntime
				if name == "berth" {
					d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host())})
					if round == 0 {
						fmt.Printf("compare berth's gzip decoder: %s\n", gzipChoice(d.Logs()))
					}
					// berthd and its shims all name the state folder in their arguments.
					rt = criRuntime{name: name, runtime: d.Runtime, images: d.Images,
						overheadPIDs: func() []int { return pidsWithArg(d.State) }, daemon: d.PID(),
						layersStored: func() int {
							return countEntries(filepath.Join(d.Root, "snapshots"), filepath.Join(d.Root, "content", "blobs", "sha256"))
						}}
				} else {
					c := startContainerd(t, containerdSetup{registryHost: reg.Host(), pauseImage: pause.Name,
						bridge: fmt.Sprintf("bcni%d", round), subnet: fmt.Sprintf("10.196.%d.0/24", round)})
					rt = criRuntime{name: name, runtime: c.runtime(), images: c.images(), overheadPIDs: c.runtimePIDs,
						layersStored: c.layersStored, daemon: c.cmd.Process.Pid}
				}
				// The probe rows take the runtime's CPU from its cgroup,
				// which its shims and helpers inherit.
				joinCgroup(t, runtimeCgroup(parent), rt.daemon)
				// The warm-up round leaves out the 250 pods and the
				// probes: the 50 pods before them have warmed what they
				// would.
				values, used := runWorkload(t, rt, parent, busybox.Name, bigName, realName, round > 0)
				if round == 0 {
					return
				}
				// Each round as it ends: a run cut short still says something.
				t.Logf("%s round %d: %s", name, round, roundedRows(values))
				if results[name] == nil {
					results[name] = map[string][]float64{}
				}
				for row, v := range values {
					results[name][row] = append(results[name][row], v)
				}
				if parts[name] == nil {
					parts[name] = map[part][]memUse{}
				}
				for k, u := range used {
					parts[name][k] = append(parts[name][k], u)
				}
			})
		}
	}
	if t.Failed() {
		return
	}
	fmt.Printf("compare %-62s %12s %12s %7s %7s\n", fmt.Sprintf("measure (medians of %d rounds)", rounds), "containerd", "berth", "ratio", "target")
	for _, m := range measures {
		if !measured(m.group) {
			continue
		}
		t.Logf("%s: containerd %v, berth %v", m.name, rounded(results["containerd"][m.name]), rounded(results["berth"][m.name]))
		c, b := median(results["containerd"][m.name]), median(results["berth"][m.name])
		fmt.Printf("compare %-62s %9.2f %-3s %8.2f %-3s %s\n", m.name, c, m.unit, b, m.unit, versus(b, c, m.target))
	}
	if measured(podRows) {
		printParts(parts)
	}
}

// versus is the ratio column and the target's: the ratio and whether it
// is at or under the target, only whether berth's count is 0 for a target
// of 0, only the ratio for a row without a target.
func versus(berth, containerd, target float64) string {
	switch {
	case target == 0 && berth == 0:
		return fmt.Sprintf("%6s = 0", "-")
	case target == 0:
		return fmt.Sprintf("%6s > 0", "-")
	case math.IsNaN(target):
		return fmt.Sprintf("%6.2f", berth/containerd)
	case berth/containerd <= target:
		return fmt.Sprintf("%6.2f ≤ %.2f", berth/containerd, target)
	}
	return fmt.Sprintf("%6.2f > %.2f", berth/containerd, target)
}

// runWorkload measures one freshly started runtime, the cold pulls first
// (the root is empty), and returns the values of the rows BERTH_BENCH_ROWS
// selects (those at 250 pods and the probes' only if many) and the memory of
// the runtime's processes by kind with 50 and with 250 pods held.
func runWorkload(t *testing.T, rt criRuntime, parent, image, bigImage, realImage string, many bool) (map[string]float64, map[part]memUse) {
	values := map[string]float64{}
	if measured(pullRows) {
		values[rowColdPull], values[rowHostPull] = timeColdPulls(t, rt, bigImage, realImage)
	}
	if !measured(podRows) && !measured(probeRows) {
		return values, nil
	}
	timePull(t, rt, image)
	used := map[part]memUse{}
	if measured(podRows) {
		runPods(t, rt, parent, image, many, values, used)
	}
	if many && measured(probeRows) {
		runProbes(t, rt, parent, image, values)
	}
	return values, used
}

// runPods measures the pod rows into values: 50 pods started one at a time,
// held for their memory, torn down one at a time; 50 started 5 in flight and
// removed; and if many, 250 started 5 in flight, held, and removed.
func runPods(t *testing.T, rt criRuntime, parent, image string, many bool, values map[string]float64, used map[part]memUse) {
	var starts []time.Duration
	ids := make([]string, pods)
	for i := range ids {
		begin := time.Now()
		id, _, err := startPod(t.Context(), rt.runtime, parent, fmt.Sprint("seq-", i), image)
		if err != nil {
			t.Fatalf("%s: %v", rt.name, err)
		}
		ids[i] = id
		starts = append(starts, time.Since(begin))
	}
	pss, rss := heldMemory(rt, parent, pods, used)
	withContainers := pss + float64(sumKB(podProcesses(parent, true), "Pss:"))/1024/pods

	var teardowns []time.Duration
	for _, id := range ids {
		begin := time.Now()
		removePod(t, rt, id)
		teardowns = append(teardowns, time.Since(begin))
	}

	begin := time.Now()
	concurrent := startPodsInFlight(t, rt, parent, image, "par-", pods, 5)
	values[row50InFlight] = time.Since(begin).Seconds()
	removePodsInFlight(t, rt, concurrent, 5)
	values[rowStart], values[rowTeardown] = ms(pct(starts, 50)), ms(pct(teardowns, 50))
	values[row50PSS], values[row50RSS], values[row50WithContainers] = pss, rss, withContainers
	if many {
		// The node of 250 pods: started 5 at a time (timed), held, its
		// memory taken, and removed 5 at a time (not timed).
		begin := time.Now()
		concurrent := startPodsInFlight(t, rt, parent, image, "many-", manyPods, 5)
		values[row250InFlight] = time.Since(begin).Seconds()
		values[row250PSS], values[row250RSS] = heldMemory(rt, parent, manyPods, used)
		removePodsInFlight(t, rt, concurrent, 5)
	}
}

// part is one kind of the runtime's processes with a number of pods held.
type part struct {
	held int
	kind string // "daemon", "pause", or the program's name (berth-shim, containerd-shim-runc-v2)
}

// memUse is what the processes of one part hold: their count and the sums
// of their PSS and RSS in KB.
type memUse struct{ procs, pss, rss int }

// heldMemory is the PSS and RSS per pod (MiB) of the runtime's processes
// with n pods held: the daemon, its processes outside the pods (shims,
// helpers) and those in the pods' cgroups that are not the workload
// (pauses). It records each kind's share in used.
func heldMemory(rt criRuntime, parent string, n int, used map[part]memUse) (pss, rss float64) {
	kinds := map[string][]int{}
	for _, pid := range rt.overheadPIDs() {
		kind := "daemon"
		if pid != rt.daemon {
			kind = filepath.Base(strings.Fields(cmdline(pid) + " ?")[0])
		}
		kinds[kind] = append(kinds[kind], pid)
	}
	kinds["pause"] = podProcesses(parent, false)
	var pssKB, rssKB int
	for kind, pids := range kinds {
		u := memUse{procs: len(pids), pss: sumKB(pids, "Pss:"), rss: sumKB(pids, "Rss:")}
		used[part{n, kind}] = u
		pssKB, rssKB = pssKB+u.pss, rssKB+u.rss
	}
	perPod := func(kb int) float64 { return float64(kb) / 1024 / float64(n) }
	return perPod(pssKB), perPod(rssKB)
}

// printParts prints, beside the table, each runtime's memory per process
// kind with 50 and with 250 pods held: medians over the rounds of the
// processes' count and their PSS and RSS per pod.
func printParts(parts map[string]map[part][]memUse) {
	fmt.Printf("compare %-10s %-4s %-26s %6s %10s %10s\n", "memory of", "held", "process", "count", "PSS / pod", "RSS / pod")
	for _, name := range []string{"containerd", "berth"} {
		keys := slices.Collect(maps.Keys(parts[name]))
		slices.SortFunc(keys, func(a, b part) int {
			if a.held != b.held {
				return a.held - b.held
			}
			return strings.Compare(a.kind, b.kind)
		})
		for _, k := range keys {
			var procs, pss, rss []float64
			for _, u := range parts[name][k] {
				procs = append(procs, float64(u.procs))
				pss = append(pss, float64(u.pss)/1024/float64(k.held))
				rss = append(rss, float64(u.rss)/1024/float64(k.held))
			}
			fmt.Printf("compare %-10s %4d %-26s %6.0f %6.2f MiB %6.2f MiB\n", name, k.held, k.kind, median(procs), median(pss), median(rss))
		}
	}
}

// timeColdPulls times the cold pull rows on the runtime's empty root: the
// 20 random layers, then the host tree image pulled, removed, and pulled
// again once its layers and blobs are gone, as a node pulls an image its GC
// removed.
func timeColdPulls(t *testing.T, rt criRuntime, bigImage, realImage string) (coldPull, realPull float64) {
	ctx := t.Context()
	// Each timed pull starts with nothing dirty on the disks: berth's
	// flush of the layers a second after a pull would otherwise land in
	// the next one, with what the runtime measured before left in the page
	// cache (containerd does not sync its layers), on the same filesystem.
	syscall.Sync()
	cold := timePull(t, rt, bigImage)
	stored := rt.layersStored()
	timePull(t, rt, realImage)
	if _, err := rt.images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: realImage}}); err != nil {
		t.Fatalf("%s: RemoveImage: %v", rt.name, err)
	}
	waitLayersGone(t, rt, stored)
	syscall.Sync()
	cpu := cpuSeconds(rt.daemon)
	real := timePull(t, rt, realImage)
	// The CPU the pull took moves less with the machine's load than its
	// wall time: on a loaded machine the wall time follows it.
	t.Logf("%s: host tree pull %.2f s, the daemon's CPU %.2f s", rt.name, real.Seconds(), cpuSeconds(rt.daemon)-cpu)
	return cold.Seconds(), real.Seconds()
}

func timePull(t *testing.T, rt criRuntime, image string) time.Duration {
	begin := time.Now()
	if _, err := rt.images.PullImage(t.Context(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}); err != nil {
		t.Fatalf("%s: pull %s: %v", rt.name, image, err)
	}
	return time.Since(begin)
}

// waitLayersGone waits until the runtime holds no more layers and blobs
// than the want it held before the removed image was pulled.
func waitLayersGone(t *testing.T, rt criRuntime, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for rt.layersStored() > want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d layers and blobs still stored a minute after RemoveImage", rt.name, rt.layersStored())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cpuSeconds is the user and system CPU time of process pid so far.
func cpuSeconds(pid int) float64 {
	u, s, _, _ := cpuTimes(pid)
	return u + s
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on Linux.
const clockTicks = 100

// countEntries counts the entries of the folders (a missing one has none).
func countEntries(dirs ...string) int {
	n := 0
	for _, d := range dirs {
		ents, _ := os.ReadDir(d)
		n += len(ents)
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// startPod runs a pod named name, below the cgroup parent, with one
// container sleeping, as the kubelet asks for a pod without
// shareProcessNamespace, and returns the pod and the container.
func startPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, parent, name, image string) (pod, ctr string, err error) {
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: "uid-" + name},
		Hostname: name,
		Linux: &runtimeapi.LinuxPodSandboxConfig{CgroupParent: fmt.Sprintf("%s/%s", parent, name),
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{
				Pid: runtimeapi.NamespaceMode_CONTAINER}}},
	}
	p, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", "", fmt.Errorf("RunPodSandbox: %w", err)
	}
	c, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.PodSandboxId, SandboxConfig: cfg,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "sleep"},
			Image: &runtimeapi.ImageSpec{Image: image}, Command: []string{"/bin/sleep", "3600"}}})
	if err != nil {
		return p.PodSandboxId, "", fmt.Errorf("CreateContainer: %w", err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		return p.PodSandboxId, c.ContainerId, fmt.Errorf("StartContainer: %w", err)
	}
	return p.PodSandboxId, c.ContainerId, nil
}

// startPodsInFlight starts n pods named prefix and their number, with
// inFlight starts running at a time.
func startPodsInFlight(t *testing.T, rt criRuntime, parent, image, prefix string, n, inFlight int) []string {
	ids := make([]string, n)
	errs := make([]error, n)
	inParallel(n, inFlight, func(i int) {
		var err error
		if ids[i], _, err = startPod(t.Context(), rt.runtime, parent, fmt.Sprint(prefix, i), image); err != nil {
			errs[i] = fmt.Errorf("%s: %w", rt.name, err)
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return ids
}

// removePodsInFlight stops and removes the pods, inFlight at a time.
func removePodsInFlight(t *testing.T, rt criRuntime, ids []string, inFlight int) {
	errs := make([]error, len(ids))
	inParallel(len(ids), inFlight, func(i int) { errs[i] = stopAndRemovePod(t.Context(), rt, ids[i]) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// inParallel calls do(0) … do(n-1), inFlight calls at a time.
func inParallel(n, inFlight int, do func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			for i := range next {
				do(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func removePod(t *testing.T, rt criRuntime, id string) {
	if err := stopAndRemovePod(t.Context(), rt, id); err != nil {
		t.Fatal(err)
	}
}

func stopAndRemovePod(ctx context.Context, rt criRuntime, id string) error {
	if _, err := rt.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("%s: StopPodSandbox: %w", rt.name, err)
	}
	if _, err := rt.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("%s: RemovePodSandbox: %w", rt.name, err)
	}
	return nil
}

func listContainers(t *testing.T, rt criRuntime, pod string) string {
	resp, err := rt.runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
	if err != nil || len(resp.Containers) != 1 {
		t.Fatalf("%s: ListContainers(pod %s) = %v, %v", rt.name, pod, resp, err)
	}
	return resp.Containers[0].Id
}

// podProcesses lists the processes in the cgroups below parent: the
// workload's own ("/bin/sleep 3600") when workload is true, else the others
// (pauses, which count as the runtime's).
func podProcesses(parent string, workload bool) []int {
	var out []int
	root := cgroupDir(parent)
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			if (cmdline(pid) == "/bin/sleep 3600") == workload {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out
}

// cgroupDir is parent in the memory hierarchy (cgroup v1) or the unified one.
func cgroupDir(parent string) string {
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		return filepath.Join("/sys/fs/cgroup/memory", parent)
	}
	return filepath.Join("/sys/fs/cgroup", parent)
}

// removeCgroupTree removes the (empty) cgroups below parent in every hierarchy.
func removeCgroupTree(parent string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*" + parent)
	roots = append(roots, filepath.Join("/sys/fs/cgroup", parent))
	for _, root := range roots {
		var dirs []string
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			os.Remove(dirs[i])
		}
	}
}

// sumKB adds a field of /proc/PID/smaps_rollup ("Pss:", "Rss:") over pids.
func sumKB(pids []int, field string) int {
	total := 0
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field); ok {
				n, _ := strconv.Atoi(strings.Fields(v)[0])
				total += n
			}
		}
	}
	return total
}

func allPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cmdline is a process's command line with spaces between arguments.
func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// pidsWithArg lists the processes whose command line contains s (berth's
// shims name their pod folder under the state folder).
func pidsWithArg(s string) []int {
	var out []int
	for _, pid := range allPIDs() {
		if strings.Contains(cmdline(pid), s) {
			out = append(out, pid)
		}
	}
	return out
}

// rounded is each round's value to 3 digits, for the log.
func rounded(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatFloat(x, 'g', 3, 64)
	}
	return out
}

// roundedRows is a round's values in the order of measures, for the log.
func roundedRows(values map[string]float64) string {
	var out []string
	for _, m := range measures {
		if v, ok := values[m.name]; ok {
			out = append(out, fmt.Sprintf("%s %s", m.name, strconv.FormatFloat(v, 'g', 3, 64)))
		}
	}
	return strings.Join(out, "; ")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
