package cluster

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// prodNS is the namespace of the VM node's steps: the netns nodes' Delete
// step empties e2e while these may still run.
const prodNS = "prod"

// productionNode: the steps on the VM node (vmnode_test.go), the node users
// run: systemd, cgroup v2, the kubelet on the systemd driver.
func (e *env) productionNode(t *testing.T, begin time.Time) {
	if !step(t, "Node", e.vmNodeReady) {
		return
	}
	step(t, "Resources", e.vmResources)
	step(t, "AppArmor", e.vmAppArmor)
	step(t, "AppArmorLocalhost", e.vmAppArmorLocalhost)
	step(t, "UserNamespace", e.vmUserNamespace)
	step(t, "InPlaceResize", e.vmResize)
	step(t, "StatsSummary", e.vmStatsSummary)
	step(t, "Streams", e.vmStreams)
	step(t, "Attach", e.vmAttach)
	step(t, "Checkpoint", e.vmCheckpoint)
	step(t, "BerthdRestart", e.vmBerthdRestart)
	t.Logf("VM node steps done in %s (then the teardown)", time.Since(begin).Round(time.Second))
}

// vmNodeReady: the node Ready with berth as its runtime and its taint; the
// kubelet on the systemd cgroup driver, which it took from berth's
// RuntimeConfig, LimitedSwap, failCgroupV1 at its default (true: the node
// is cgroup v2, or the kubelet would not start), no feature gate but
// PodAndContainerStatsFromCRI (vmKubeletConfig); the node's setup saw
// cgroup2, AppArmor and swap.
func (e *env) vmNodeReady(t *testing.T) {
	v := e.vm
	v.join(t)
	n := e.waitNodeReady(t, v.name, time.Minute)
	if rv := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(rv, "berth://0.") {
		t.Errorf("%s: runtime version %q, want berth://<semantic version>", v.name, rv)
	}
	tainted := false
	for _, taint := range n.Spec.Taints {
		tainted = tainted || (taint.Key == vmTaint && taint.Effect == corev1.TaintEffectNoSchedule)
	}
	if !tainted {
		t.Errorf("%s: taints %v, want %s:NoSchedule", v.name, n.Spec.Taints, vmTaint)
	}
	t.Logf("kubectl get node %s -o yaml:\n%s", v.name, e.kubectl(t, "get", "node", v.name, "-o", "yaml"))

	var configz struct {
		Config struct {
			CgroupDriver string `json:"cgroupDriver"`
			FailCgroupV1 *bool  `json:"failCgroupV1"`
			MemorySwap   struct {
				SwapBehavior string `json:"swapBehavior"`
			} `json:"memorySwap"`
			FeatureGates map[string]bool `json:"featureGates"`
		} `json:"kubeletconfig"`
	}
	raw := e.kubectl(t, "get", "--raw", "/api/v1/nodes/"+v.name+"/proxy/configz")
	if err := json.Unmarshal([]byte(raw), &configz); err != nil {
		t.Fatalf("configz: %v\n%s", err, raw)
	}
	c := configz.Config
	t.Logf("%s's kubelet (configz): cgroupDriver %q, failCgroupV1 %v, memorySwap.swapBehavior %q, featureGates %v",
		v.name, c.CgroupDriver, deref(c.FailCgroupV1), c.MemorySwap.SwapBehavior, c.FeatureGates)
	if c.CgroupDriver != "systemd" {
		t.Errorf("the kubelet's cgroupDriver %q, want systemd (from berth's RuntimeConfig)", c.CgroupDriver)
	}
	if c.FailCgroupV1 == nil || !*c.FailCgroupV1 {
		t.Errorf("failCgroupV1 %v, want its default, true", deref(c.FailCgroupV1))
	}
	if c.MemorySwap.SwapBehavior != "LimitedSwap" {
		t.Errorf("memorySwap.swapBehavior %q, want LimitedSwap", c.MemorySwap.SwapBehavior)
	}
	if len(c.FeatureGates) != 1 || !c.FeatureGates["PodAndContainerStatsFromCRI"] {
		t.Errorf("feature gates %v, want only PodAndContainerStatsFromCRI", c.FeatureGates)
	}
	// The kubelet says where its driver came from.
	fromCRI := ""
	for _, l := range strings.Split(readFile(t, v.kubelet), "\n") {
		if strings.Contains(l, "cgroup driver setting received from the CRI runtime") {
			fromCRI = strings.TrimSpace(l)
		}
	}
	if !strings.Contains(fromCRI, `cgroupDriver="systemd"`) {
		t.Errorf("no kubelet log line of the systemd driver received from the CRI runtime (%q)", fromCRI)
	}
	t.Logf("kubelet: %s", fromCRI)
	setup := ""
	for _, l := range strings.Split(readFile(t, v.console), "\n") {
		if strings.HasPrefix(l, "berth-node: ready") {
			setup = strings.TrimSpace(l)
		}
	}
	t.Logf("console: %s", setup)
	if !strings.Contains(setup, "cgroup cgroup2;") || !strings.Contains(setup, "AppArmor enabled: Y") {
		t.Errorf("the node's setup: %q, want cgroup2 and AppArmor enabled", setup)
	}
	e.apply(t, prodNamespace)
	kubeenv.WaitFor(t, time.Minute, "the default service account of "+prodNS, func() (bool, string) {
		_, err := e.kubectlErr("get", "serviceaccount", "default", "-n", prodNS)
		return err == nil, fmt.Sprint(err)
	})
	e.apply(t, cgroupProbe)
	e.waitPod(t, prodNS, "cgprobe", vmStartTimeout, "Running", running)
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

const prodNamespace = `apiVersion: v1
kind: Namespace
metadata:
  name: prod
  labels:
    berth.test/cluster: "1"
`

// vmPodSpec places a pod on the VM node, tolerating its taint.
const vmPodSpec = `      nodeSelector: {kubernetes.io/hostname: berth-vm-node}
      tolerations: [{key: berth.test/vm-node, operator: Exists, effect: NoSchedule}]
      terminationGracePeriodSeconds: 0
`

// vmPod is a pod of prod on the VM node (tolerating its taint), named
// name, with labels, running sleep or the web server (web) with resources
// (the container's resources block, "" for none) and securityContext
// (likewise); podSpec adds to the pod's spec.
func vmPod(name, labels string, web bool, resources, securityContext, podSpec string) string {
	y := "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + ", namespace: prod, labels: {" + labels + "}}\nspec:\n" +
		strings.ReplaceAll(vmPodSpec, "      ", "  ") + podSpec + "  containers:\n  - name: app\n    image: IMAGE\n"
	if web {
		y += "    command: [\"/bin/web\", \"serve\", \":8080\"]\n    readinessProbe:\n      httpGet: {path: /, port: 8080}\n      periodSeconds: 1\n"
	} else {
		y += "    command: [\"sleep\", \"36000\"]\n"
	}
	if resources != "" {
		y += "    resources: " + resources + "\n"
	}
	if securityContext != "" {
		y += "    securityContext: " + securityContext + "\n"
	}
	return y
}

// cgroupProbe reads the VM node's cgroup tree and processes: privileged,
// the host's PID namespace, /sys/fs/cgroup at /cg.
var cgroupProbe = vmPod("cgprobe", "", false, "", "{privileged: true}", "  hostPID: true\n") +
	"    volumeMounts: [{name: cg, mountPath: /cg, readOnly: true}]\n  volumes: [{name: cg, hostPath: {path: /sys/fs/cgroup}}]\n"

// resDeployment: two Burstable replicas (requests below limits).
var resDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: res, namespace: prod}
spec:
  replicas: 2
  selector:
    matchLabels: {app: res}
  template:
    metadata:
      labels: {app: res}
    spec:
` + vmPodSpec + `      containers:
      - name: app
        image: IMAGE
        command: ["sleep", "36000"]
        resources:
          requests: {cpu: 100m, memory: 32Mi}
          limits: {cpu: 300m, memory: 64Mi}
`

// guaranteedPod: requests equal to limits.
var guaranteedPod = vmPod("guaranteed", "", false, "{requests: {cpu: 200m, memory: 48Mi}, limits: {cpu: 200m, memory: 48Mi}}", "", "")

const pageSize = 4096

// cpuWeight is cgroup v2's cpu.weight for CPU shares, as runc's
// libcontainer (opencontainers/cgroups) converts them for berth.
func cpuWeight(shares float64) int64 {
	l := math.Log2(shares)
	return int64(math.Ceil(math.Pow(10, (l*l+125*l)/612.0-7.0/34.0)))
}

// cgroupFiles reads the files of the cgroup folder dir (below the VM's
// /sys/fs/cgroup) through the probe pod.
func (e *env) cgroupFiles(t *testing.T, dir string, files ...string) map[string]string {
	t.Helper()
	script := ""
	for _, f := range files {
		script += fmt.Sprintf("printf '%%s=%%s\\n' %s \"$(cat /cg/%s/%s)\"; ", f, dir, f)
	}
	out := e.kubectl(t, "exec", "-n", prodNS, "cgprobe", "--", "sh", "-c", script)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, val, ok := strings.Cut(l, "="); ok {
			got[k] = val
		}
	}
	return got
}

// containerCgroup is the cgroup folder (below /sys/fs/cgroup) of the
// container of pod p, found below its pod slice by the container's ID.
func (e *env) containerCgroup(t *testing.T, podSlice string, p *corev1.Pod) string {
	t.Helper()
	id := p.Status.ContainerStatuses[0].ContainerID
	if i := strings.Index(id, "://"); i >= 0 {
		id = id[i+3:]
	}
	out := strings.TrimSpace(e.kubectl(t, "exec", "-n", prodNS, "cgprobe", "--", "ls", "/cg/"+podSlice))
	for _, f := range strings.Fields(out) {
		if strings.Contains(f, id) {
			return podSlice + "/" + f
		}
	}
	t.Fatalf("no cgroup of container %s in %s: %s", id, podSlice, out)
	return ""
}

// podSlice is the kubelet's systemd slice of pod p (below /sys/fs/cgroup).
func podSlice(p *corev1.Pod) string {
	uid := strings.ReplaceAll(string(p.UID), "-", "_")
	switch p.Status.QOSClass {
	case corev1.PodQOSGuaranteed:
		return "kubepods.slice/kubepods-pod" + uid + ".slice"
	case corev1.PodQOSBurstable:
		return "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice"
	}
	return "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uid + ".slice"
}

// vmResources: a Deployment's Burstable pods and a Guaranteed pod Ready on
// the VM node, and the cgroup v2 files of their containers under the
// kubelet's systemd slices as their specs imply: memory.max (the limit),
// memory.high "max" (memory QoS is on by default in 1.37, but sets
// memory.high only with a memoryThrottlingFactor, which the kubelet's
// configuration leaves unset by default; memory.min and memory.low 0,
// the default memoryReservationPolicy None),
// memory.swap.max (LimitedSwap: the request's share of the node's memory,
// of its swap, for Burstable; 0 for Guaranteed), cpu.max (the limit) and
// cpu.weight (the request's shares); the pod slices' limits too.
func (e *env) vmResources(t *testing.T) {
	start := time.Now()
	e.apply(t, resDeployment)
	e.apply(t, guaranteedPod)
	e.kubectl(t, "rollout", "status", "-n", prodNS, "deployment/res", "--timeout", vmStartTimeout.String())
	g := e.waitPod(t, prodNS, "guaranteed", vmStartTimeout, "Running", running)
	fmt.Printf("cluster: %s: 2 Burstable replicas and a Guaranteed pod Ready %s after the apply\n", e.vm.name, time.Since(start).Round(100*time.Millisecond))

	var n corev1.Node
	if err := json.Unmarshal([]byte(e.kubectl(t, "get", "node", e.vm.name, "-o", "json")), &n); err != nil {
		t.Fatal(err)
	}
	memCap := n.Status.Capacity.Memory().Value()
	var swapCap int64
	if s := n.Status.NodeInfo.Swap; s != nil && s.Capacity != nil {
		swapCap = *s.Capacity
	}
	if swapCap <= 0 {
		t.Fatalf("node %s reports no swap (nodeInfo.swap %v)", e.vm.name, n.Status.NodeInfo.Swap)
	}
	t.Logf("node memory %d, swap %d", memCap, swapCap)

	files := []string{"memory.max", "memory.high", "memory.min", "memory.low", "memory.swap.max", "cpu.max", "cpu.weight"}
	expect := func(what string, got, want map[string]string) {
		t.Helper()
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s: %s = %q, want %q", what, k, got[k], w)
			}
		}
	}
	const mi = 1 << 20
	burstable := e.pods(t, prodNS, "app=res")
	if len(burstable) != 2 {
		t.Fatalf("%d pods of app=res, want 2", len(burstable))
	}
	for _, p := range burstable {
		if p.Spec.NodeName != e.vm.name || p.Status.QOSClass != corev1.PodQOSBurstable {
			t.Fatalf("pod %s on %q, QoS %s: want %s, Burstable", p.Name, p.Spec.NodeName, p.Status.QOSClass, e.vm.name)
		}
		slice := podSlice(&p)
		dir := e.containerCgroup(t, slice, &p)
		got := e.cgroupFiles(t, dir, files...)
		t.Logf("Burstable %s: %s: %v", p.Name, dir, got)
		swap := int64(float64(32*mi)/float64(memCap)*float64(swapCap)) / pageSize * pageSize
		expect("Burstable "+p.Name, got, map[string]string{
			"memory.max":      strconv.Itoa(64 * mi),
			"memory.high":     "max",
			"memory.min":      "0",
			"memory.low":      "0",
			"memory.swap.max": strconv.FormatInt(swap, 10),
			"cpu.max":         "30000 100000",
			"cpu.weight":      strconv.FormatInt(cpuWeight(102), 10),
		})
		if swap <= 0 {
			t.Errorf("Burstable %s: swap limit %d, want some", p.Name, swap)
		}
		pod := e.cgroupFiles(t, slice, "memory.max", "cpu.max")
		expect("the slice of "+p.Name, pod, map[string]string{"memory.max": strconv.Itoa(64 * mi), "cpu.max": "30000 100000"})
	}
	if g.Spec.NodeName != e.vm.name || g.Status.QOSClass != corev1.PodQOSGuaranteed {
		t.Fatalf("pod guaranteed on %q, QoS %s: want %s, Guaranteed", g.Spec.NodeName, g.Status.QOSClass, e.vm.name)
	}
	slice := podSlice(g)
	dir := e.containerCgroup(t, slice, g)
	got := e.cgroupFiles(t, dir, files...)
	t.Logf("Guaranteed: %s: %v", dir, got)
	expect("Guaranteed", got, map[string]string{
		"memory.max":      strconv.Itoa(48 * mi),
		"memory.high":     "max",
		"memory.min":      "0",
		"memory.low":      "0",
		"memory.swap.max": "0",
		"cpu.max":         "20000 100000",
		"cpu.weight":      strconv.FormatInt(cpuWeight(204), 10),
	})
}

// appArmorPod asks for the runtime's default AppArmor profile.
var appArmorPod = vmPod("apparmor", "", false, "", "{appArmorProfile: {type: RuntimeDefault}}", "")

// vmAppArmor: appArmorProfile RuntimeDefault puts the container's process
// in berth's default profile, enforced, as the VM's kernel shows it.
func (e *env) vmAppArmor(t *testing.T) {
	e.apply(t, appArmorPod)
	p := e.waitPod(t, prodNS, "apparmor", vmStartTimeout, "Running", running)
	e.expectAppArmorLabel(t, p, "berth-default (enforce)")
}

// expectAppArmorLabel: each process of pod p's container, as the VM's
// kernel shows it through the probe pod (/proc/PID/attr/current), has the
// AppArmor label want.
func (e *env) expectAppArmorLabel(t *testing.T, p *corev1.Pod, want string) {
	t.Helper()
	dir := e.containerCgroup(t, podSlice(p), p)
	out := e.kubectl(t, "exec", "-n", prodNS, "cgprobe", "--", "sh", "-c",
		fmt.Sprintf("for p in $(cat /cg/%s/cgroup.procs); do echo $p $(cat /proc/$p/attr/current) $(cat /proc/$p/cmdline | tr '\\0' ' '); done", dir))
	t.Logf("processes of the %s pod's container, their AppArmor label and command:\n%s", p.Name, out)
	if strings.TrimSpace(out) == "" {
		t.Fatalf("no process in %s", dir)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.Contains(l, " "+want+" ") {
			t.Errorf("process %q: want %s", l, want)
		}
	}
}

// denyTmpProfile is a Localhost profile that allows everything but writes
// below /tmp, as test/integration's loadAppArmorProfile writes them.
const denyTmpProfile = `profile berth-test-deny-tmp flags=(attach_disconnected,mediate_deleted) {
  file,
  network,
  capability,
  signal,
  ptrace,
  umount,
  deny /tmp/** w,
}
`

// localhostPods: one pod in the VM's profile berth-test-deny-tmp, one
// Unconfined beside it.
var localhostPods = vmPod("aa-localhost", "", false, "", "{appArmorProfile: {type: Localhost, localhostProfile: berth-test-deny-tmp}}", "") +
	"---\n" + vmPod("aa-unconfined", "", false, "", "{appArmorProfile: {type: Unconfined}}", "")

// vmAppArmorLocalhost: a profile loaded on the VM node (its
// apparmor_parser, in the VM's namespaces), then a pod with
// appArmorProfile Localhost naming it runs in it, enforced, as the VM's
// kernel shows it; in it a write below /tmp fails and one elsewhere works,
// while the same write works in an Unconfined pod.
func (e *env) vmAppArmorLocalhost(t *testing.T) {
	if out, err := e.kubectlErr(onVM("sh", "-c", "printf '%s' '"+denyTmpProfile+"' | apparmor_parser -Kr && grep berth-test-deny-tmp /sys/kernel/security/apparmor/profiles")...); err != nil ||
		!strings.Contains(out, "berth-test-deny-tmp (enforce)") {
		t.Fatalf("loading berth-test-deny-tmp on the VM node: %q %v", out, err)
	}
	e.apply(t, localhostPods)
	p := e.waitPod(t, prodNS, "aa-localhost", vmStartTimeout, "Running", running)
	u := e.waitPod(t, prodNS, "aa-unconfined", vmStartTimeout, "Running", running)
	e.expectAppArmorLabel(t, p, "berth-test-deny-tmp (enforce)")
	e.expectAppArmorLabel(t, u, "unconfined")
	const write = "touch /tmp/aa && ls /tmp/aa"
	out, err := e.kubectlErr("exec", "-n", prodNS, "aa-localhost", "--", "sh", "-c", write)
	t.Logf("in aa-localhost, %s: %q %v", write, out, err)
	if err == nil || !strings.Contains(err.Error(), "Permission denied") {
		t.Errorf("in the Localhost profile's pod, %s: %q %v, want Permission denied", write, out, err)
	}
	if out := e.exec(t, prodNS, "aa-localhost", "sh", "-c", "touch /aa && ls /aa"); out != "/aa\n" {
		t.Errorf("in the Localhost profile's pod, a write outside /tmp: %q, want /aa", out)
	}
	if out := e.exec(t, prodNS, "aa-unconfined", "sh", "-c", write); out != "/tmp/aa\n" {
		t.Errorf("in the Unconfined pod, %s: %q, want /tmp/aa", write, out)
	}
}

// usernsPods: hostUsers: false, without the service account token (its
// projected volume is a tmpfs, which the VM's kernel, 6.1, cannot idmap:
// tmpfs has idmapped mounts from 6.3), and one with the token.
var usernsPods = vmPod("userns", "", false, "", "", "  hostUsers: false\n  automountServiceAccountToken: false\n") +
	"---\n" + vmPod("userns-token", "", false, "", "", "  hostUsers: false\n")

// vmUserNamespace: a hostUsers: false pod Ready on the VM node; inside, root
// mapped to a 65536-ID host range; on the node (through the probe pod) its
// container's processes have that uid_map and run as the range's first
// host UID. One with the service account token is refused its container,
// as berth says: the token's tmpfs cannot be idmapped on this kernel.
func (e *env) vmUserNamespace(t *testing.T) {
	e.apply(t, usernsPods)
	p := e.waitPod(t, prodNS, "userns", vmStartTimeout, "Running", running)
	refused := e.waitPod(t, prodNS, "userns-token", vmStartTimeout, "refused its container (CreateContainerError)", func(p *corev1.Pod) bool {
		s := p.Status.ContainerStatuses
		return len(s) == 1 && s[0].State.Waiting != nil && s[0].State.Waiting.Reason == "CreateContainerError"
	})
	if w := refused.Status.ContainerStatuses[0].State.Waiting; !strings.Contains(w.Message, "kube-api-access") || !strings.Contains(w.Message, "must support idmapped mounts on this kernel") {
		t.Errorf("userns-token: %s, want berth's refusal to idmap the token's volume", w.Message)
	}
	e.kubectl(t, "delete", "pod", "-n", prodNS, "userns-token", "--timeout", vmStartTimeout.String())
	m := e.exec(t, prodNS, "userns", "cat", "/proc/self/uid_map")
	var inside, host, length uint64
	if n, _ := fmt.Sscan(m, &inside, &host, &length); n != 3 || inside != 0 || host == 0 || length != 65536 {
		t.Fatalf("uid_map in the hostUsers: false pod: %q, want container 0 mapped to a 65536-ID host range", m)
	}
	if id := e.exec(t, prodNS, "userns", "id", "-u"); id != "0\n" {
		t.Errorf("id -u in the hostUsers: false pod: %q, want 0", id)
	}
	dir := e.containerCgroup(t, podSlice(p), p)
	out := e.kubectl(t, "exec", "-n", prodNS, "cgprobe", "--", "sh", "-c",
		fmt.Sprintf("for p in $(cat /cg/%s/cgroup.procs); do echo $p $(cat /proc/$p/uid_map) $(grep ^Uid: /proc/$p/status); done", dir))
	t.Logf("processes of the userns pod's container on the node: PID, uid_map, Uid:\n%s", out)
	if strings.TrimSpace(out) == "" {
		t.Fatalf("no process in %s", dir)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		want := []string{"0", fmt.Sprint(host), "65536", "Uid:"}
		for i := 0; i < 4; i++ {
			want = append(want, fmt.Sprint(host))
		}
		if len(f) != 1+len(want) || strings.Join(f[1:], " ") != strings.Join(want, " ") {
			t.Errorf("process %q on the node: want uid_map 0 %d 65536 and host UIDs %d (the range's first)", l, host, host)
		}
	}
}

// resizePod is Burstable; its resize raises the CPU request and both limits.
var resizePod = vmPod("resize", "", false, "{requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 300m, memory: 64Mi}}", "", "")

// vmResize: kubectl patch --subresource resize changes the container's
// cgroup v2 files under its slice and status.containerStatuses[].resources,
// without a restart.
func (e *env) vmResize(t *testing.T) {
	e.apply(t, resizePod)
	p := e.waitPod(t, prodNS, "resize", vmStartTimeout, "Running", running)
	dir := e.containerCgroup(t, podSlice(p), p)
	e.kubectl(t, "patch", "pod", "resize", "-n", prodNS, "--subresource", "resize", "--patch",
		`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"150m","memory":"32Mi"},"limits":{"cpu":"400m","memory":"96Mi"}}}]}}`)
	const mi = 1 << 20
	want := map[string]string{"memory.max": strconv.Itoa(96 * mi), "cpu.max": "40000 100000", "cpu.weight": strconv.FormatInt(cpuWeight(153), 10)}
	kubeenv.WaitFor(t, vmStartTimeout, "the resize in the container's cgroup and status", func() (bool, string) {
		got := e.cgroupFiles(t, dir, "memory.max", "cpu.max", "cpu.weight")
		p = e.pod(t, prodNS, "resize")
		cs := p.Status.ContainerStatuses[0]
		if cs.Resources == nil {
			return false, fmt.Sprintf("cgroup %v, no resources in the status", got)
		}
		status := fmt.Sprintf("cgroup %v, status limits cpu %s memory %s requests cpu %s", got,
			cs.Resources.Limits.Cpu(), cs.Resources.Limits.Memory(), cs.Resources.Requests.Cpu())
		for k, w := range want {
			if got[k] != w {
				return false, status
			}
		}
		return cs.Resources.Limits.Cpu().String() == "400m" && cs.Resources.Limits.Memory().String() == "96Mi" &&
			cs.Resources.Requests.Cpu().String() == "150m", status
	})
	if c := p.Status.ContainerStatuses[0]; c.RestartCount != 0 {
		t.Errorf("the resized container restarted %d times", c.RestartCount)
	}
	slice := e.cgroupFiles(t, podSlice(p), "memory.max", "cpu.max")
	if slice["memory.max"] != strconv.Itoa(96*mi) || slice["cpu.max"] != "40000 100000" {
		t.Errorf("the pod slice after the resize: %v, want memory.max %d, cpu.max 40000 100000", slice, 96*mi)
	}
}

// vmWebPods: a web server on the VM node, and one on a netns node (no
// toleration) behind a Service.
var vmWebPods = vmPod("vmweb", "app: vmweb", true, "", "", "") + `---
apiVersion: v1
kind: Pod
metadata: {name: netweb, namespace: prod, labels: {app: netweb}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: web
    image: IMAGE
    command: ["/bin/web", "serve", ":8080"]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: netweb, namespace: prod}
spec:
  selector: {app: netweb}
  ports: [{port: 80, targetPort: 8080}]
`

// vmStreams: kubectl exec (with its exit code), logs and port-forward to a
// pod on the VM node; from it, a pod on a netns node by each of its IPs
// and a ClusterIP Service (the VM's kube-proxy, nftables).
func (e *env) vmStreams(t *testing.T) {
	e.apply(t, vmWebPods)
	e.waitPod(t, prodNS, "vmweb", vmStartTimeout, "Running", running)
	other := e.waitPod(t, prodNS, "netweb", startTimeout, "Running", running)
	if other.Spec.NodeName == e.vm.name {
		t.Fatalf("netweb on %s, want a netns node", other.Spec.NodeName)
	}
	if _, err := e.kubectlErr("exec", "-n", prodNS, "vmweb", "--", "sh", "-c", "exit 7"); err == nil || !strings.Contains(err.Error(), "exit code 7") {
		t.Errorf("kubectl exec of exit 7: %v, want exit code 7", err)
	}
	e.kubectl(t, "exec", "-n", prodNS, "vmweb", "--", "sh", "-c", "echo hello from the VM node >/proc/1/fd/1")
	kubeenv.WaitFor(t, 30*time.Second, "kubectl logs of vmweb", func() (bool, string) {
		out, err := e.kubectlErr("logs", "-n", prodNS, "vmweb")
		return err == nil && strings.Contains(out, "hello from the VM node"), fmt.Sprintf("%q %v", out, err)
	})
	e.portForwardGet(t, prodNS, "vmweb", "v1 vmweb\n", time.Minute)
	for _, ip := range other.Status.PodIPs {
		url := "http://" + net.JoinHostPort(ip.IP, "8080") + "/"
		if out := e.exec(t, prodNS, "vmweb", "/bin/web", "get", url); out != "v1 netweb\n" {
			t.Errorf("GET %s from the VM node's pod: %q", url, out)
		}
	}
	svc := strings.TrimSpace(e.kubectl(t, "get", "service", "-n", prodNS, "netweb", "-o", "jsonpath={.spec.clusterIP}"))
	kubeenv.WaitFor(t, time.Minute, "the Service from the VM node's pod", func() (bool, string) {
		out, err := e.kubectlErr("exec", "-n", prodNS, "vmweb", "--", "/bin/web", "get", "http://"+svc+"/")
		return err == nil && out == "v1 netweb\n", fmt.Sprintf("%q %v", out, err)
	})
}

// attachPod reads its stdin, once.
var attachPod = vmPod("vmattach", "", false, "", "", "  restartPolicy: Never\n") + "    stdin: true\n    stdinOnce: true\n"

// vmAttach: kubectl attach -i to a pod on the VM node: its stdin in, its
// output back; the container ends when the attach closes its stdin.
func (e *env) vmAttach(t *testing.T) {
	e.apply(t, strings.Replace(attachPod, `["sleep", "36000"]`, `["cat"]`, 1))
	e.waitPod(t, prodNS, "vmattach", vmStartTimeout, "Running", running)
	out, err := e.kubectlIn("hello through attach on the VM node\n", "attach", "-i", "-q", "-n", prodNS, "vmattach")
	if err != nil || !strings.Contains(out, "hello through attach on the VM node\n") {
		t.Errorf("kubectl attach -i: %q %v", out, err)
	}
	p := e.waitPod(t, prodNS, "vmattach", vmStartTimeout, "Succeeded once its stdin closed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if s := p.Status.ContainerStatuses; len(s) != 1 || s[0].State.Terminated == nil || s[0].State.Terminated.ExitCode != 0 {
		t.Errorf("vmattach's container: %+v, want terminated with exit code 0", s)
	}
}

// vmPodState is what must not change across berthd's restarts: each pod
// of prod on the VM node, with its containers' IDs and restart counts.
func (e *env) vmPodState(t *testing.T) map[string]string {
	t.Helper()
	state := map[string]string{}
	for _, p := range e.pods(t, prodNS, "") {
		if p.Spec.NodeName != e.vm.name {
			continue
		}
		s := string(p.Status.Phase)
		for _, c := range p.Status.ContainerStatuses {
			s += fmt.Sprintf(" %s=%s/%d/ready=%v", c.Name, c.ContainerID, c.RestartCount, c.Ready)
		}
		state[p.Name] = s
	}
	return state
}

// onVM is a command run in PID 1's namespaces of the VM, through the
// probe pod (hostPID): the VM's own busybox nsenter, by its path in PID 1's
// root (the test image has no nsenter).
func onVM(args ...string) []string {
	return append([]string{"exec", "-n", prodNS, "cgprobe", "--", "/proc/1/root/bin/busybox", "nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--"}, args...)
}

// berthdUnit is berthd.service's main PID, restart count and state in the
// VM (systemctl).
func (e *env) berthdUnit() (string, error) {
	out, err := e.kubectlErr(onVM("systemctl", "show", "-p", "MainPID", "-p", "NRestarts", "-p", "ActiveState", "berthd")...)
	return strings.Join(strings.Fields(out), " "), err
}

// vmBerthdRestart: systemctl restart berthd, then a SIGKILL of berthd's
// main process (Restart=always brings the unit back): each time the
// unit has a new berthd and every pod of the VM node keeps running, with
// the same containers and no restart.
func (e *env) vmBerthdRestart(t *testing.T) {
	before := e.vmPodState(t)
	if len(before) < 3 {
		t.Fatalf("%d pods on the VM node, want the earlier steps' (at least 3): %v", len(before), before)
	}
	unit, err := e.berthdUnit()
	if err != nil || !strings.Contains(unit, "ActiveState=active") {
		t.Fatalf("berthd.service: %q %v", unit, err)
	}
	t.Logf("berthd.service: %s", unit)
	for _, how := range []string{"systemctl restart", "SIGKILL"} {
		pid := strings.TrimPrefix(strings.Fields(unit)[0], "MainPID=")
		cmd := "systemctl --no-block restart berthd"
		if how == "SIGKILL" {
			cmd = "kill -KILL " + pid
		}
		start := time.Now()
		if _, err := e.kubectlErr(onVM("sh", "-c", cmd)...); err != nil {
			t.Logf("%s: %v (the exec went through the berthd it restarts)", how, err)
		}
		kubeenv.WaitFor(t, 2*time.Minute, "berthd.service back with a new berthd after "+how, func() (bool, string) {
			unit, err = e.berthdUnit()
			return err == nil && strings.Contains(unit, "ActiveState=active") && !strings.Contains(unit, "MainPID="+pid+" "), fmt.Sprintf("%q %v", unit, err)
		})
		t.Logf("after %s: berthd.service %s, %s", how, unit, time.Since(start).Round(100*time.Millisecond))
		kubeenv.WaitFor(t, time.Minute, "the VM node's pods unchanged after "+how, func() (bool, string) {
			after := e.vmPodState(t)
			for name, s := range before {
				if after[name] != s {
					return false, fmt.Sprintf("%s: %s, was %s", name, after[name], s)
				}
			}
			return true, ""
		})
	}
}

// pressurePod: one container spinning under a tenth of a CPU (its runnable
// time past the quota is CPU pressure), one writing files three times its
// memory limit (page cache reclaimed under the limit is memory pressure).
var pressurePod = `apiVersion: v1
kind: Pod
metadata: {name: pressure, namespace: prod}
spec:
` + strings.ReplaceAll(vmPodSpec, "      ", "  ") + `  containers:
  - name: spin
    image: IMAGE
    command: ["sh", "-c", "while :; do :; done"]
    resources: {limits: {cpu: 100m, memory: 32Mi}}
  - name: reclaim
    image: IMAGE
    command: ["sh", "-c", "while :; do /bin/busybox dd if=/dev/zero of=/tmp/f bs=1048576 count=48 2>/dev/null; rm -f /tmp/f; done"]
    resources: {limits: {cpu: 200m, memory: 16Mi}}
`

// vmStatsSummary: the kubelet's summary API, its pod and container stats
// from berth (PodAndContainerStatsFromCRI), carries the pressure berth reads
// from the cgroups: CPU pressure on the spinning container, memory pressure
// on the reclaiming one, both on the pod, I/O PSI present on each; and each
// container's available memory and swap.
func (e *env) vmStatsSummary(t *testing.T) {
	e.apply(t, pressurePod)
	e.waitPod(t, prodNS, "pressure", vmStartTimeout, "Running", running)
	var pod *statsapi.PodStats
	kubeenv.WaitFor(t, 3*time.Minute, "CPU and memory pressure of pod pressure in the VM node's summary", func() (bool, string) {
		pod = e.summaryPod(t, prodNS, "pressure")
		if pod == nil {
			return false, "no stats of the pod"
		}
		spin, reclaim := summaryContainer(pod, "spin"), summaryContainer(pod, "reclaim")
		ok := psiSome(cpuPSI(pod.CPU)) > 0 && psiSome(memoryPSI(pod.Memory)) > 0 &&
			psiSome(cpuPSI(spin.CPU)) > 0 && psiSome(memoryPSI(reclaim.Memory)) > 0
		return ok, fmt.Sprintf("pod CPU %+v, memory %+v; spin CPU %+v; reclaim memory %+v",
			cpuPSI(pod.CPU), memoryPSI(pod.Memory), cpuPSI(spin.CPU), memoryPSI(reclaim.Memory))
	})
	for _, c := range pod.Containers {
		if c.IO == nil || c.IO.PSI == nil {
			t.Errorf("container %s: I/O stats %+v, want its PSI", c.Name, c.IO)
		}
	}
	if pod.IO == nil || pod.IO.PSI == nil {
		t.Errorf("pod: I/O stats %+v, want its PSI", pod.IO)
	}
	checkSummaryMemoryLimits(t, summaryContainer(pod, "spin"), 32<<20)
	checkSummaryMemoryLimits(t, summaryContainer(pod, "reclaim"), 16<<20)
	t.Logf("summary of pod pressure: CPU PSI %+v, memory PSI %+v", *pod.CPU.PSI, *pod.Memory.PSI)
	e.kubectl(t, "delete", "pod", "-n", prodNS, "pressure", "--wait=false")
}

// checkSummaryMemoryLimits checks the memory and swap a container of
// limit (in a Guaranteed pod, so allowed no swap under LimitedSwap) has
// left in the summary: what its working set leaves of the limit, and swap
// used with none available.
func checkSummaryMemoryLimits(t *testing.T, c statsapi.ContainerStats, limit uint64) {
	t.Helper()
	if m := c.Memory; m == nil || m.WorkingSetBytes == nil || m.AvailableBytes == nil || *m.AvailableBytes != limit-*m.WorkingSetBytes {
		t.Errorf("container %s: memory %+v, want available bytes, its %d-byte limit less the working set", c.Name, m, limit)
	}
	if s := c.Swap; s == nil || s.SwapUsageBytes == nil || s.SwapAvailableBytes == nil || *s.SwapAvailableBytes != 0 {
		t.Errorf("container %s: swap %+v, want its usage and no swap available", c.Name, s)
	}
}

// summaryPod is pod ns/name's stats in the VM node's summary API, nil
// while it has none.
func (e *env) summaryPod(t *testing.T, ns, name string) *statsapi.PodStats {
	t.Helper()
	var s statsapi.Summary
	if err := json.Unmarshal([]byte(e.kubectl(t, "get", "--raw", "/api/v1/nodes/"+e.vm.name+"/proxy/stats/summary")), &s); err != nil {
		t.Fatal(err)
	}
	for i, p := range s.Pods {
		if p.PodRef.Namespace == ns && p.PodRef.Name == name {
			return &s.Pods[i]
		}
	}
	return nil
}

// summaryContainer is container name's stats in p, empty if it has none.
func summaryContainer(p *statsapi.PodStats, name string) statsapi.ContainerStats {
	for _, c := range p.Containers {
		if c.Name == name {
			return c
		}
	}
	return statsapi.ContainerStats{}
}

func cpuPSI(c *statsapi.CPUStats) *statsapi.PSIStats {
	if c == nil {
		return nil
	}
	return c.PSI
}

func memoryPSI(m *statsapi.MemoryStats) *statsapi.PSIStats {
	if m == nil {
		return nil
	}
	return m.PSI
}

// psiSome is the total stalled time of some tasks in psi, 0 without it.
func psiSome(psi *statsapi.PSIStats) uint64 {
	if psi == nil {
		return 0
	}
	return psi.Some.Total
}
