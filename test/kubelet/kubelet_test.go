// Package kubelet is berth's kubelet end-to-end tier: a stock kubelet
// (k8s.io/kubernetes, built into bin/kubelet by `make test-kubelet`) runs
// static pods on a berthd of its own, and every scenario is checked from the
// kubelet's view (its /pods and /healthz) and from berth's (CRI calls).
//
// It runs only with BERTH_KUBELET=1, as root; see `make test-kubelet`.
package kubelet

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// startTimeout bounds a pod's way to Running: pull, unpack, start, on a
// loaded 2-core CI machine.
const startTimeout = 3 * time.Minute

// criLogLine is one line of the CRI log format: time, stream, tag, content.
var criLogLine = regexp.MustCompile(`^(\S+) (stdout|stderr) ([FP]) (.*)$`)

func TestKubelet(t *testing.T) {
	requireTier(t)
	begin := time.Now()
	e := newEnv(t, "")
	t.Logf("berthd and kubelet ready in %s (kubelet %s, berthd %s)", time.Since(begin).Round(time.Millisecond), e.kubeletBin, e.berthBin)

	// Every pod starts at once: the scenarios then only wait for their own.
	hostPort := kubeenv.FreePort(t)
	e.writeManifest("web", webPod)
	e.writeManifest("probes", probesPod)
	e.writeManifest("crash", crashPod)
	e.writeManifest("init", initPod)
	e.writeManifest("hostnet", strings.ReplaceAll(hostNetPod, "HOSTPORT", strconv.Itoa(hostPort)))
	e.writeManifest("limits", limitsPod)
	e.writeManifest("guaranteed", guaranteedPod)
	e.writeManifest("seccomp", seccompPod)
	e.writeManifest("userns", usernsPod)
	all := []string{"web", "probes", "crash", "init", "hostnet", "limits", "guaranteed", "seccomp", "userns"}

	// Numbered as in the issue; run in this order because scenario 5 needs
	// every pod up, and scenario 4 takes them all down (so it is also how
	// the run ends: the kubelet removes its pods through berth).
	step := func(name string, f func(t *testing.T)) {
		start := time.Now()
		t.Run(name, f)
		t.Logf("%s: %s", name, time.Since(start).Round(100*time.Millisecond))
	}
	step("1-TwoContainerPod", func(t *testing.T) { e.twoContainerPod(t) })
	step("2-Probes", func(t *testing.T) { e.probes(t) })
	step("3-CrashLoopBackOff", func(t *testing.T) { e.crashLoop(t) })
	step("6-InitContainer", func(t *testing.T) { e.initContainer(t) })
	step("6-HostNetwork", func(t *testing.T) { e.hostNetwork(t, hostPort) })
	step("6-Resources", func(t *testing.T) { e.resources(t) })
	step("6-Seccomp", func(t *testing.T) { e.seccomp(t) })
	step("6-UserNamespace", func(t *testing.T) { e.userNamespace(t) })
	step("7-ExecAttachPortForward", func(t *testing.T) { e.streams(t) })
	step("5-BerthdKilled", func(t *testing.T) { e.berthdKilled(t) })
	step("4-ManifestRemoved", func(t *testing.T) { e.manifestRemoved(t, all) })
	if body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.healthz)); err != nil || body != "ok" {
		t.Errorf("kubelet /healthz at the end: %q %v", body, err)
	}
	t.Logf("scenarios done in %s (then the teardown)", time.Since(begin).Round(time.Second))
}

// ---- 1: a two-container pod, its network and its logs ----

func (e *env) twoContainerPod(t *testing.T) {
	p := e.waitPod(t, "web", startTimeout, "Running with both containers ready", running)
	uid := string(p.UID)
	if p.Status.PodIP == "" {
		t.Fatalf("kubelet reports no pod IP: %s", describe(p))
	}

	// The pod answers HTTP on its address, from the node.
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(p.Status.PodIP, "8080"))
	kubeenv.WaitFor(t, 20*time.Second, "HTTP from the pod IP", func() (bool, string) {
		body, err := kubeenv.Get(url)
		return err == nil && body == "hello from berth\n", fmt.Sprintf("%q %v", body, err)
	})

	// berth: one READY sandbox with that IP, the namespace mode it was given,
	// labels and annotations unchanged between List and Status.
	sb := e.onlySandbox(t, uid)
	st := e.sandboxStatus(t, sb.Id)
	if got := st.GetNetwork().GetIp(); got != p.Status.PodIP {
		t.Errorf("PodSandboxStatus network.ip = %q, kubelet's podIP = %q", got, p.Status.PodIP)
	}
	if m := st.GetLinux().GetNamespaces().GetOptions().GetNetwork(); m != runtimeapi.NamespaceMode_POD {
		t.Errorf("PodSandboxStatus network namespace mode = %s, want POD", m)
	}
	for k, want := range map[string]string{uidLabel: uid, "io.kubernetes.pod.name": p.Name, "io.kubernetes.pod.namespace": "e2e", "app": "web"} {
		if sb.Labels[k] != want || st.Labels[k] != want {
			t.Errorf("label %s: List %q, Status %q, want %q", k, sb.Labels[k], st.Labels[k], want)
		}
	}
	if !maps.Equal(sb.Labels, st.Labels) || !maps.Equal(sb.Annotations, st.Annotations) {
		t.Errorf("List and Status disagree:\nlabels %v / %v\nannotations %v / %v", sb.Labels, st.Labels, sb.Annotations, st.Annotations)
	}
	if st.Annotations["berth.test/note"] != "kept as is" || st.Annotations["kubernetes.io/config.source"] != "file" {
		t.Errorf("sandbox annotations %v lack the pod's own and the kubelet's", st.Annotations)
	}

	for _, name := range []string{"logger", "httpd"} {
		c := e.runningContainer(t, uid, name)
		cs := e.containerStatus(t, c.Id)
		want := e.logFile(p, name, 0)
		if cs.LogPath != want {
			t.Errorf("%s: ContainerStatus log_path = %q, want %q (absolute: the pod's log directory + the container's log path)", name, cs.LogPath, want)
		}
		for _, k := range []string{"io.kubernetes.container.hash", "io.kubernetes.container.restartCount"} {
			if cs.Annotations[k] == "" || cs.Annotations[k] != c.Annotations[k] {
				t.Errorf("%s: annotation %s: Status %q, List %q", name, k, cs.Annotations[k], c.Annotations[k])
			}
		}
		if cs.Labels["io.kubernetes.container.name"] != name || !maps.Equal(cs.Labels, c.Labels) {
			t.Errorf("%s: labels Status %v, List %v", name, cs.Labels, c.Labels)
		}
		if ks := ctrStatus(p, name); ks == nil || ks.ContainerID != "berth://"+c.Id {
			t.Errorf("%s: kubelet's containerID = %v, berth's %s", name, ks, c.Id)
		}
		// The kubelet asks ImageStatus with the image ID the container reports.
		is, err := e.img.ImageStatus(kubeenv.Ctx(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: cs.ImageRef}})
		if err != nil || is.Image == nil || is.Image.GetSize() == 0 || is.Image.Id != e.imageID {
			t.Errorf("%s: ImageStatus(%q) = %v, %v; want image %s with a size", name, cs.ImageRef, is.GetImage(), err, e.imageID)
		}
	}

	// The logs the kubelet serves (kubectl logs) are CRI-format files in its
	// pod log folder, written by berth.
	logPath := e.logFile(p, "logger", 0)
	kubeenv.WaitFor(t, 20*time.Second, "logger output in "+logPath, func() (bool, string) {
		b, err := os.ReadFile(logPath)
		return err == nil && strings.Contains(string(b), " stdout F tick 2\n") && strings.Contains(string(b), " stderr F tock 2\n"),
			fmt.Sprintf("%q %v", tail(string(b), 300), err)
	})
	checkCRILog(t, logPath)

	// The kubelet's DNS config and hostname reach the pod.
	logger := e.runningContainer(t, uid, "logger")
	if rc := e.exec(t, logger.Id, "cat", "/etc/resolv.conf"); !strings.Contains(rc, "nameserver 192.0.2.53") || !strings.Contains(rc, "berth-e2e.test") {
		t.Errorf("pod resolv.conf = %q, want the kubelet's resolvConf (nameserver 192.0.2.53, search berth-e2e.test)", rc)
	}
	if h := strings.TrimSpace(e.exec(t, logger.Id, "hostname")); h != p.Name {
		t.Errorf("pod hostname = %q, want %q", h, p.Name)
	}

	// Runtime-wide answers the kubelet relies on.
	rs, err := e.rt.Status(kubeenv.Ctx(t), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	conds := map[string]bool{}
	for _, c := range rs.GetStatus().GetConditions() {
		conds[c.Type] = c.Status
	}
	if !conds[runtimeapi.RuntimeReady] || !conds[runtimeapi.NetworkReady] {
		t.Errorf("Status conditions %v: want RuntimeReady and NetworkReady true", rs.GetStatus().GetConditions())
	}
	rc, err := e.rt.RuntimeConfig(kubeenv.Ctx(t), &runtimeapi.RuntimeConfigRequest{})
	if err != nil || rc.GetLinux().GetCgroupDriver() != runtimeapi.CgroupDriver_CGROUPFS {
		t.Errorf("RuntimeConfig = %v, %v; want cgroupfs", rc, err)
	}
	const unknown = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if _, err := e.rt.ContainerStatus(kubeenv.Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: unknown}); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStatus(unknown) = %v, want NotFound", err)
	}
	if _, err := e.rt.PodSandboxStatus(kubeenv.Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: unknown}); status.Code(err) != codes.NotFound {
		t.Errorf("PodSandboxStatus(unknown) = %v, want NotFound", err)
	}

	// The kubelet's resource stats (/stats/summary, what metrics-server and
	// eviction read) carry the containers' CPU and memory, from berth's
	// ListContainerStats.
	kubeenv.WaitFor(t, 45*time.Second, "CPU and memory of both containers in the kubelet's /stats/summary", func() (bool, string) {
		var sum summary
		body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/stats/summary", e.readOnly))
		if err == nil {
			err = json.Unmarshal([]byte(body), &sum)
		}
		if err != nil {
			return false, err.Error()
		}
		for _, ps := range sum.Pods {
			if ps.PodRef.UID != uid {
				continue
			}
			got := map[string]bool{}
			for _, c := range ps.Containers {
				got[c.Name] = c.CPU.UsageCoreNanoSeconds > 0 && c.Memory.WorkingSetBytes > 0
			}
			return got["logger"] && got["httpd"], fmt.Sprintf("%+v", ps.Containers)
		}
		return false, "pod not in the summary"
	})
}

// summary is the part of the kubelet's /stats/summary the tier reads.
type summary struct {
	Pods []struct {
		PodRef     struct{ Name, UID string }
		Containers []struct {
			Name string
			CPU  struct {
				UsageCoreNanoSeconds uint64 `json:"usageCoreNanoSeconds"`
			}
			Memory struct {
				WorkingSetBytes uint64 `json:"workingSetBytes"`
			}
		}
	}
}

// checkCRILog checks that every line of a CRI log file is in the CRI format
// with an RFC 3339 time.
func checkCRILog(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		m := criLogLine.FindStringSubmatch(sc.Text())
		if m == nil {
			t.Errorf("%s line %d not in the CRI log format: %q", path, n, sc.Text())
			continue
		}
		if _, err := time.Parse(time.RFC3339Nano, m[1]); err != nil {
			t.Errorf("%s line %d: time %q: %v", path, n, m[1], err)
		}
	}
}

// ---- 2: probes ----

func (e *env) probes(t *testing.T) {
	p := e.waitPod(t, "probes", startTimeout, "healthy ready, flaky restarted by its liveness probe, unready not ready", func(p *corev1.Pod) bool {
		h, f, u := ctrStatus(p, "healthy"), ctrStatus(p, "flaky"), ctrStatus(p, "unready")
		return h != nil && f != nil && u != nil &&
			h.Ready && h.State.Running != nil && // exec liveness + HTTP readiness pass
			f.RestartCount >= 1 && f.LastTerminationState.Terminated != nil && // liveness failure → restart
			u.State.Running != nil && !u.Ready // a failing readiness probe only keeps it unready
	})
	uid := string(p.UID)
	if h := ctrStatus(p, "healthy"); h.RestartCount != 0 {
		t.Errorf("healthy: restarted %d times; its liveness probe should pass", h.RestartCount)
	}
	if u := ctrStatus(p, "unready"); u.RestartCount != 0 {
		t.Errorf("unready: restarted %d times; a readiness probe must not restart it", u.RestartCount)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			t.Errorf("pod Ready while a container is not: %v", p.Status.Conditions)
		}
	}
	// berth: the killed attempt is kept EXITED next to its successor, in the same sandbox.
	e.onlySandbox(t, uid)
	flaky := e.containers(t, uid, "flaky")
	if len(flaky) < 2 {
		t.Fatalf("berth has %d flaky containers, want the killed attempt and its successor", len(flaky))
	}
	if flaky[0].State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("flaky attempt %d is %s, want EXITED", flaky[0].Metadata.Attempt, flaky[0].State)
	}
	t.Logf("flaky: restart count %d; %d attempts held by berth", ctrStatus(p, "flaky").RestartCount, len(flaky))
}

// ---- 3: CrashLoopBackOff ----

func (e *env) crashLoop(t *testing.T) {
	// While the first restart backs off, the kubelet shows when attempt 1 ended.
	var backOffFrom time.Time
	p := e.waitPod(t, "crash", 2*time.Minute, "CrashLoopBackOff after restarts", func(p *corev1.Pod) bool {
		c := ctrStatus(p, "crasher")
		if c == nil || c.State.Waiting == nil || c.State.Waiting.Reason != "CrashLoopBackOff" {
			return false
		}
		if lt := c.LastTerminationState.Terminated; c.RestartCount == 1 && lt != nil {
			backOffFrom = lt.FinishedAt.Time
		}
		return c.RestartCount >= 2
	})
	c := ctrStatus(p, "crasher")
	lt := c.LastTerminationState.Terminated
	if lt == nil || lt.ExitCode != 3 {
		t.Fatalf("crasher last state = %+v, want terminated with exit code 3", c.LastTerminationState)
	}
	// Back-off: the restart after attempt 1 waited (10 s by default).
	if !backOffFrom.IsZero() {
		if gap := lt.StartedAt.Sub(backOffFrom); gap < 5*time.Second {
			t.Errorf("a later attempt started %s after attempt 1 ended: no back-off", gap)
		} else {
			t.Logf("back-off after attempt 1: %s", gap)
		}
	}
	uid := string(p.UID)
	e.onlySandbox(t, uid) // restarts happen inside the one sandbox
	// berth keeps the last exited attempt (the kubelet removes older ones and
	// their logs), with its exit code and its log under the pod's log folder.
	var last *runtimeapi.ContainerStatus
	for _, ct := range e.containers(t, uid, "crasher") {
		r, err := e.rt.ContainerStatus(kubeenv.Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: ct.Id})
		if status.Code(err) == codes.NotFound {
			continue // removed by the kubelet since the list
		}
		if err != nil {
			t.Fatalf("ContainerStatus %s: %v", ct.Id, err)
		}
		if r.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			last = r.Status
		}
	}
	if last == nil {
		t.Fatal("berth has no exited crasher container")
	}
	if last.ExitCode != 3 || last.Reason != "Error" {
		t.Errorf("attempt %d: exit code %d reason %q, want 3 Error", last.Metadata.Attempt, last.ExitCode, last.Reason)
	}
	if want := e.logFile(p, "crasher", int(last.Metadata.Attempt)); last.LogPath != want {
		t.Errorf("attempt %d: log_path %q, want %q", last.Metadata.Attempt, last.LogPath, want)
	}
	if b, err := os.ReadFile(last.LogPath); err != nil || !strings.Contains(string(b), " stdout F crashing with 3\n") {
		t.Errorf("attempt %d's log: %q %v", last.Metadata.Attempt, b, err)
	}
}

// ---- 6: init container, host network, resources ----

func (e *env) initContainer(t *testing.T) {
	p := e.waitPod(t, "init", startTimeout, "init container completed, main running", func(p *corev1.Pod) bool {
		ic := ctrStatus(p, "prepare")
		return running(p) && ic != nil && ic.State.Terminated != nil
	})
	ic := ctrStatus(p, "prepare").State.Terminated
	if ic.ExitCode != 0 || ic.Reason != "Completed" {
		t.Errorf("init container terminated with %d %q, want 0 Completed", ic.ExitCode, ic.Reason)
	}
	uid := string(p.UID)
	inits := e.containers(t, uid, "prepare")
	if len(inits) != 1 || inits[0].State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("berth's init containers: %v, want one EXITED", inits)
	}
	prep := e.containerStatus(t, inits[0].Id)
	main := e.runningContainer(t, uid, "main")
	mainSt := e.containerStatus(t, main.Id)
	if prep.ExitCode != 0 || mainSt.StartedAt < prep.FinishedAt {
		t.Errorf("init exit %d finished at %d; main started at %d: must start after", prep.ExitCode, prep.FinishedAt, mainSt.StartedAt)
	}
	if got := e.exec(t, main.Id, "cat", "/data/msg"); got != "prepared-by-init\n" {
		t.Errorf("main sees /data/msg = %q, want what the init container wrote", got)
	}
	kubeenv.WaitFor(t, 10*time.Second, "main's log", func() (bool, string) {
		b, err := os.ReadFile(e.logFile(p, "main", 0))
		return err == nil && strings.Contains(string(b), " stdout F prepared-by-init\n"), fmt.Sprintf("%q %v", b, err)
	})
}

// seccomp checks the filter each container runs under, as its process
// sees it: seccompProfile RuntimeDefault is berth's default profile (mode 2,
// filter), no profile is none.
func (e *env) seccomp(t *testing.T) {
	p := e.waitPod(t, "seccomp", startTimeout, "Running", running)
	for name, want := range map[string]string{"confined": "Seccomp:\t2\n", "plain": "Seccomp:\t0\n"} {
		c := e.runningContainer(t, string(p.UID), name)
		if got := e.exec(t, c.Id, "grep", "^Seccomp:", "/proc/self/status"); got != want {
			t.Errorf("container %s: %q, want %q", name, got, want)
		}
	}
}

// userNamespace checks the hostUsers: false pod runs as root of its own user
// namespace, mapped to the host range the kubelet picked (one 65536-ID
// range, never starting at host 0).
func (e *env) userNamespace(t *testing.T) {
	p := e.waitPod(t, "userns", startTimeout, "Running", running)
	c := e.runningContainer(t, string(p.UID), "main")
	var inside, host, length uint64
	m := e.exec(t, c.Id, "cat", "/proc/self/uid_map")
	if n, _ := fmt.Sscan(m, &inside, &host, &length); n != 3 || inside != 0 || host == 0 || length != 65536 {
		t.Errorf("uid_map of the hostUsers: false pod: %q, want container 0 mapped to a 65536-ID host range", m)
	}
	if id := e.exec(t, c.Id, "id", "-u"); id != "0\n" {
		t.Errorf("id -u inside: %q, want 0", id)
	}
	if r := e.exec(t, c.Id, "sh", "-c", "head -c 4 /bin/busybox | wc -c; touch /made-here && echo ok"); r != "4\nok\n" {
		t.Errorf("reading an image file and writing the rootfs: %q", r)
	}
	t.Logf("userns: uid_map %q", m)
}

func (e *env) hostNetwork(t *testing.T, port int) {
	p := e.waitPod(t, "hostnet", startTimeout, "Running", running)
	uid := string(p.UID)
	kubeenv.WaitFor(t, 20*time.Second, "HTTP on the host's loopback", func() (bool, string) {
		body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		return err == nil && body == "hello from the host network\n", fmt.Sprintf("%q %v", body, err)
	})
	sb := e.onlySandbox(t, uid)
	st := e.sandboxStatus(t, sb.Id)
	if m := st.GetLinux().GetNamespaces().GetOptions().GetNetwork(); m != runtimeapi.NamespaceMode_NODE {
		t.Errorf("PodSandboxStatus network namespace mode = %s, want NODE", m)
	}
	c := e.runningContainer(t, uid, "httpd")
	pid := e.containerPID(t, c.Id)
	mine, _ := os.Readlink("/proc/self/ns/net")
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil || mine != theirs {
		t.Errorf("container's network namespace %q (%v), the host's %q", theirs, err, mine)
	}
	t.Logf("hostnet: kubelet podIP %q, berth network.ip %q", p.Status.PodIP, st.GetNetwork().GetIp())
}

// resources checks the pod and container cgroups the kubelet's requests and
// limits became: the kubelet sets the pod's, berth the container's.
func (e *env) resources(t *testing.T) {
	v2 := e.cgroups.V2()
	cases := []struct {
		pod, container string
		qos            corev1.PodQOSClass
		qosDir         string // below kubepods
		memory, quota  int64
		shares         int64
	}{
		{"limits", "limited", corev1.PodQOSBurstable, "burstable/", 64 << 20, 25000, 102},
		{"guaranteed", "fixed", corev1.PodQOSGuaranteed, "", 48 << 20, 20000, 204},
	}
	for _, tc := range cases {
		t.Run(tc.pod, func(t *testing.T) {
			p := e.waitPod(t, tc.pod, startTimeout, "Running", running)
			if p.Status.QOSClass != tc.qos {
				t.Errorf("QoS class %s, want %s", p.Status.QOSClass, tc.qos)
			}
			uid := string(p.UID)
			c := e.runningContainer(t, uid, tc.container)
			pid := e.containerPID(t, c.Id)
			podCg := e.cgroups.Root + "/kubepods/" + tc.qosDir + "pod" + uid
			ctrCg := kubeenv.ProcCgroup(t, pid, "memory", v2)
			if !strings.HasPrefix(ctrCg, podCg+"/") {
				t.Fatalf("container process %d is in cgroup %s, not below the pod's %s", pid, ctrCg, podCg)
			}
			if cpuCg := kubeenv.ProcCgroup(t, pid, "cpu", v2); cpuCg != ctrCg {
				t.Errorf("container's cpu cgroup %s differs from its memory cgroup %s", cpuCg, ctrCg)
			}
			for _, cg := range []string{podCg, ctrCg} {
				if v2 {
					kubeenv.ExpectFile(t, "", cg, "memory.max", strconv.FormatInt(tc.memory, 10))
					kubeenv.ExpectFile(t, "", cg, "cpu.max", fmt.Sprintf("%d 100000", tc.quota))
					continue
				}
				kubeenv.ExpectFile(t, "memory", cg, "memory.limit_in_bytes", strconv.FormatInt(tc.memory, 10))
				kubeenv.ExpectFile(t, "cpu", cg, "cpu.cfs_quota_us", strconv.FormatInt(tc.quota, 10))
				kubeenv.ExpectFile(t, "cpu", cg, "cpu.cfs_period_us", "100000")
				kubeenv.ExpectFile(t, "cpu", cg, "cpu.shares", strconv.FormatInt(tc.shares, 10))
			}
			adj, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
			t.Logf("%s: pod cgroup %s, container cgroup %s, oom_score_adj %s", tc.pod, podCg, ctrCg, strings.TrimSpace(string(adj)))
		})
	}
}

// ---- 5: berthd killed and restarted under running pods ----

func (e *env) berthdKilled(t *testing.T) {
	stable := []string{"web", "probes", "crash", "init", "hostnet", "limits", "guaranteed"}
	// These restart on their own (liveness, crash loop): only their sandbox must stay.
	restarting := map[string]bool{"flaky": true, "crasher": true}
	type before struct {
		uid       string
		sandbox   string
		restarts  map[string]int32
		container map[string]string // name → ID, for containers that do not restart on their own
	}
	was := map[string]before{}
	for _, name := range stable {
		p := e.waitPod(t, name, startTimeout, "containers running", func(p *corev1.Pod) bool {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Running == nil && !restarting[cs.Name] {
					return false
				}
			}
			return len(p.Status.ContainerStatuses) == len(p.Spec.Containers)
		})
		b := before{uid: string(p.UID), restarts: map[string]int32{}, container: map[string]string{}}
		b.sandbox = e.onlySandbox(t, b.uid).Id
		for _, cs := range p.Status.ContainerStatuses {
			b.restarts[cs.Name] = cs.RestartCount
			if !restarting[cs.Name] {
				b.container[cs.Name] = e.runningContainer(t, b.uid, cs.Name).Id
			}
		}
		was[name] = b
	}
	web := e.mustPod(t, "web")
	loggerID := was["web"].container["logger"]
	loggerPID := e.containerPID(t, loggerID)
	logPath := e.logFile(web, "logger", 0)
	ticksBefore := countLines(t, logPath, " stdout F tick ")
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(web.Status.PodIP, "8080"))

	killedAt := time.Now()
	e.berthd.Stop(syscall.SIGKILL, 10*time.Second)
	// Without berthd the containers keep running, serving and logging.
	time.Sleep(5 * time.Second)
	if err := syscall.Kill(loggerPID, 0); err != nil {
		t.Errorf("logger (pid %d) is gone while berthd is down: %v", loggerPID, err)
	}
	if body, err := kubeenv.Get(url); err != nil || body != "hello from berth\n" {
		t.Errorf("web pod while berthd is down: %q %v", body, err)
	}
	logOffset := fileSize(e.berthd.Log)
	e.launchBerthd()
	e.reconnect()
	t.Logf("berthd down for %s", time.Since(killedAt).Round(100*time.Millisecond))

	// The kubelet reconnects: berthd serves its periodic calls again.
	kubeenv.WaitFor(t, 60*time.Second, "the kubelet's calls on the new berthd", func() (bool, string) {
		b, _ := os.ReadFile(e.berthd.Log)
		if int64(len(b)) < logOffset {
			return false, "short log"
		}
		after := string(b[logOffset:])
		return strings.Contains(after, "method=/runtime.v1.RuntimeService/Status ") &&
			strings.Contains(after, "method=/runtime.v1.RuntimeService/ListPodSandbox "), "no Status and ListPodSandbox calls logged yet"
	})
	// Give the kubelet time to act on what it sees (PLEG relists every
	// second, pod workers resync): it must not recreate anything.
	check := func() {
		t.Helper()
		for _, name := range stable {
			b := was[name]
			sbs := e.sandboxes(t, b.uid)
			if len(sbs) != 1 || sbs[0].Id != b.sandbox || sbs[0].State != runtimeapi.PodSandboxState_SANDBOX_READY {
				t.Fatalf("%s: sandboxes after the restart %v, want only %s READY", name, sbs, b.sandbox)
			}
			for cname, id := range b.container {
				if got := e.runningContainer(t, b.uid, cname).Id; got != id {
					t.Fatalf("%s/%s: running container %s, was %s: recreated", name, cname, got, id)
				}
			}
		}
	}
	for i := 0; i < 15; i++ {
		check()
		time.Sleep(time.Second)
	}
	for _, name := range stable {
		b := was[name]
		p := e.mustPod(t, name)
		for cname, id := range b.container {
			cs := ctrStatus(p, cname)
			if cs == nil || cs.State.Running == nil || cs.ContainerID != "berth://"+id || cs.RestartCount != b.restarts[cname] {
				t.Errorf("%s/%s after the restart: kubelet says %s; want running %s with %d restarts", name, cname, describe(p), id, b.restarts[cname])
			}
		}
	}
	if got := e.containerPID(t, loggerID); got != loggerPID {
		t.Errorf("logger's pid %d after the restart, was %d", got, loggerPID)
	}
	if out := e.exec(t, loggerID, "echo", "exec after restart"); out != "exec after restart\n" {
		t.Errorf("ExecSync after the restart: %q", out)
	}
	// Output written while berthd was down is in the log, and logging goes on.
	elapsed := time.Since(killedAt)
	ticks := countLines(t, logPath, " stdout F tick ")
	if want := ticksBefore + int(elapsed.Seconds()/2); ticks < want {
		t.Errorf("logger wrote %d lines in the %s since berthd was killed (%d → %d), want at least %d more", ticks-ticksBefore, elapsed.Round(time.Second), ticksBefore, ticks, want-ticksBefore)
	}
	if body, err := kubeenv.Get(url); err != nil || body != "hello from berth\n" {
		t.Errorf("web pod after the restart: %q %v", body, err)
	}
	if body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.healthz)); err != nil || body != "ok" {
		t.Errorf("kubelet /healthz after the restart: %q %v", body, err)
	}
}

func countLines(t *testing.T, path, substr string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), substr)
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// ---- 4: removing the manifests ----

// manifestRemoved removes every manifest: the kubelet stops each pod and its
// container GC removes them; afterwards berth holds nothing of any of them.
func (e *env) manifestRemoved(t *testing.T, names []string) {
	uids := map[string]string{}
	var ips []string
	for _, name := range names {
		p := e.waitPod(t, name, startTimeout, "listed", func(*corev1.Pod) bool { return true })
		uids[name] = string(p.UID)
		if !p.Spec.HostNetwork && p.Status.PodIP != "" {
			ips = append(ips, p.Status.PodIP)
		}
		e.removeManifest(name)
	}
	kubeenv.WaitFor(t, time.Minute, "the kubelet dropping the pods", func() (bool, string) {
		pods, err := e.kubeletPods()
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range pods {
			left = append(left, p.Name)
		}
		return len(pods) == 0, fmt.Sprintf("kubelet still lists %v", left)
	})
	// The kubelet's container GC (every minute) removes the sandboxes.
	kubeenv.WaitFor(t, 2*time.Minute, "berth holding no pod or container", func() (bool, string) {
		var left []string
		for name, uid := range uids {
			for _, s := range e.sandboxes(t, uid) {
				left = append(left, name+" sandbox "+s.Id+" "+s.State.String())
			}
			for _, c := range e.containers(t, uid, "") {
				left = append(left, name+" container "+c.Metadata.GetName()+" "+c.State.String())
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})

	// Nothing of them on disk, in the kernel or as a process either.
	time.Sleep(2 * time.Second) // the kubelet removes pod cgroups on its next housekeeping
	if left := e.berthd.Leftovers(e.kubelet.PID()); len(left) != 0 {
		t.Errorf("berth left: %v", left)
	}
	for _, ip := range ips {
		if conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), time.Second); err == nil {
			conn.Close()
			t.Errorf("%s still answers", ip)
		}
	}
	kubeenv.WaitFor(t, 30*time.Second, "pod cgroups removed", func() (bool, string) {
		var left []string
		for _, dir := range e.cgroups.Dirs() {
			for _, uid := range uids {
				if strings.Contains(dir, uid) {
					left = append(left, dir)
				}
			}
		}
		return len(left) == 0, fmt.Sprint(left)
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
