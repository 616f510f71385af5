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

// measures are the rows of the comparison, in the order printed, with the
// target ratio (berth / containerd) of issue #26 (a per-pod footprint near
// the floor). The rows at 250 pods are measured in the counted rounds only.
var measures = []struct {
	name   string
	unit   string
	target float64
	pull   bool // measured with BERTH_BENCH_ROWS=pull
}{
	{"pod start p50, sequential (run + create + start)", "ms", 0.25, false},
	{"teardown p50 (stop + remove pod)", "ms", 0.25, false},
	{"ExecSync(true) p50", "ms", 0.33, false},
	{"50 pods, 5 in flight: wall", "s", 0.25, false},
	{"250 pods, 5 in flight: wall", "s", 0.25, false},
	{"memory per pod, 50 held: PSS of runtime processes / 50", "MiB", 0.33, false},
	{"the same, RSS", "MiB", 0.33, false},
	{"the same with the containers' own memory, PSS", "MiB", 0.33, false},
	{"memory per pod, 250 held: PSS of runtime processes / 250", "MiB", 0.33, false},
	{"the same, RSS", "MiB", 0.33, false},
	{"cold pull, 20 layers, 100 MiB gzip", "s", 0.33, true},
	{"cold pull, 20 layers of host files (after RemoveImage)", "s", 0.33, true},
}

// manyPods is the larger node of the comparison: its start with 5 in
// flight and its memory held are the rows at 250 pods.
const manyPods = 250

// pullRowsOnly is BERTH_BENCH_ROWS=pull: the runtimes only pull, for work
// on the pull path.
func pullRowsOnly() bool { return os.Getenv("BERTH_BENCH_ROWS") == "pull" }

// podRowsOnly is BERTH_BENCH_ROWS=pods: the cold pulls are left out, for
// work on pods.
func podRowsOnly() bool { return os.Getenv("BERTH_BENCH_ROWS") == "pods" }

// measured says whether the run measures the row.
func measured(pull bool) bool {
	return pull && !podRowsOnly() || !pull && !pullRowsOnly()
}

// TestCompareContainerd (make bench-compare) runs one workload against berth
// (built-in network) and against Debian's containerd 1.6 (runc, CNI bridge
// and portmap), each on fresh folders, alternating, one warm-up round and
// three counted ones (the 250 pods in the counted ones only), and prints each measure's medians and their ratio. It
// asserts nothing: the numbers are for people and commit messages.
// BERTH_BENCH_ROWS=pull runs the cold pull rows alone, =pods all but them;
// BERTH_BENCH_ROUNDS sets the counted rounds.
func TestCompareContainerd(t *testing.T) {
	harness.RequireEnv(t, "BERTH_BENCH_COMPARE")
	reg := harness.NewRegistry(t)
	busybox := reg.Push(t, "bench/busybox:1", harness.BusyboxImage(t, harness.ImageSpec{}))
	// containerd needs a pause image; berth has its own and needs none.
	pause := reg.Push(t, "bench/pause:1", harness.BusyboxImage(t, harness.ImageSpec{
		Config: v1.Config{Entrypoint: []string{"/bin/sleep", "2147483647"}}}))
	// The cold pull rows' images (the host tree takes most of a minute to build).
	var bigName, realName string
	if !podRowsOnly() {
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

	results := map[string][][]float64{}     // runtime → measure → one value per round
	parts := map[string]map[part][]memUse{} // runtime → process kind → one use per round
	rounds := countedRounds()
	for round := 0; round <= rounds; round++ {
		for _, name := range []string{"containerd", "berth"} {
			t.Run(fmt.Sprintf("%s/round%d", name, round), func(t *testing.T) {
				parent := fmt.Sprintf("/bench-%s-%d-%d", name, os.Getpid(), round)
				t.Cleanup(func() { removeCgroupTree(parent) })
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
					bridge := fmt.Sprintf("bcni%d", round)
					subnet := fmt.Sprintf("10.196.%d.0/24", round)
					c := startContainerd(t, reg.Host(), pause.Name, bridge, subnet)
					rt = criRuntime{name: name, runtime: c.runtime(), images: c.images(), overheadPIDs: c.runtimePIDs,
						layersStored: c.layersStored, daemon: c.cmd.Process.Pid}
				}
				// The warm-up round leaves out the 250 pods: the 50
				// before them have warmed what they would.
				values, used := runWorkload(t, rt, parent, busybox.Name, bigName, realName, round > 0)
				if round == 0 {
					return
				}
				// Each round as it ends: a run cut short still says something.
				t.Logf("%s round %d: %v", name, round, rounded(values))
				for i, v := range values {
					if len(results[name]) <= i {
						results[name] = append(results[name], nil)
					}
					results[name][i] = append(results[name][i], v)
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
	for i, m := range measures {
		if !measured(m.pull) {
			continue
		}
		t.Logf("%s: containerd %v, berth %v", m.name, rounded(results["containerd"][i]), rounded(results["berth"][i]))
		c, b := median(results["containerd"][i]), median(results["berth"][i])
		fmt.Printf("compare %-62s %9.2f %-3s %8.2f %-3s %6.2f %s %.2f\n", m.name, c, m.unit, b, m.unit, b/c, verdict(b/c, m.target), m.target)
	}
	if !pullRowsOnly() {
		printParts(parts)
	}
}

func verdict(ratio, target float64) string {
	if ratio <= target {
		return "≤"
	}
	return ">"
}

// runWorkload measures one freshly started runtime, in the order of
// measures (the cold pull first: the root is empty), and returns the
// values in that order (NaN for rows BERTH_BENCH_ROWS leaves out, and for
// the 250 pods' rows unless many) and the memory of the runtime's
// processes by kind with 50 and with 250 pods held.
func runWorkload(t *testing.T, rt criRuntime, parent, image, bigImage, realImage string, many bool) ([]float64, map[part]memUse) {
	ctx := t.Context()
	values := make([]float64, len(measures))
	for i := range values {
		values[i] = math.NaN()
	}
	if !podRowsOnly() {
		values[len(values)-2], values[len(values)-1] = timeColdPulls(t, rt, bigImage, realImage)
	}
	if pullRowsOnly() {
		return values, nil
	}
	timePull(t, rt, image)

	var starts []time.Duration
	ids := make([]string, pods)
	for i := range ids {
		begin := time.Now()
		id, _, err := startPod(ctx, rt.runtime, parent, fmt.Sprint("seq-", i), image)
		if err != nil {
			t.Fatalf("%s: %v", rt.name, err)
		}
		ids[i] = id
		starts = append(starts, time.Since(begin))
	}
	firstCtr := listContainers(t, rt, ids[0])
	var execs []time.Duration
	for range 20 {
		begin := time.Now()
		resp, err := rt.runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: firstCtr, Cmd: []string{"/bin/true"}, Timeout: 10})
		if err != nil || resp.ExitCode != 0 {
			t.Fatalf("%s: ExecSync(true) = %v, %v", rt.name, resp, err)
		}
		execs = append(execs, time.Since(begin))
	}
	used := map[part]memUse{}
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
	values[3] = time.Since(begin).Seconds()
	removePodsInFlight(t, rt, concurrent, 5)
	values[0], values[1], values[2] = ms(pct(starts, 50)), ms(pct(teardowns, 50)), ms(pct(execs, 50))
	values[5], values[6], values[7] = pss, rss, withContainers
	if many {
		// The node of 250 pods: started 5 at a time (timed), held, its
		// memory taken, and removed 5 at a time (not timed).
		begin := time.Now()
		concurrent := startPodsInFlight(t, rt, parent, image, "many-", manyPods, 5)
		values[4] = time.Since(begin).Seconds()
		values[8], values[9] = heldMemory(rt, parent, manyPods, used)
		removePodsInFlight(t, rt, concurrent, 5)
	}
	return values, used
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

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
