// Package cluster is berth's whole-flow tier: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, a kubelet and kube-proxy of the
// current Kubernetes release (built into bin/cluster by `make test-cluster`)
// run a cluster of two nodes with berth as their runtime, each node in
// network and mount namespaces of its own with its own berthd, kubelet and
// kube-proxy (node_test.go), the control plane on the host; every scenario
// is what a user does with kubectl, checked from kubectl's view and from
// berth's on the node where the pod runs.
//
// It runs only with BERTH_CLUSTER=1, as root; see `make test-cluster`.
package cluster

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
)

// startTimeout bounds a workload's way to Ready on a loaded 2-core CI machine.
const startTimeout = 3 * time.Minute

const ns = "e2e"

func TestCluster(t *testing.T) {
	requireTier(t)
	begin := time.Now()
	e := newEnv(t, vmEnabled())
	t.Logf("cluster up in %s", time.Since(begin).Round(100*time.Millisecond))
	// The netns nodes' steps and the VM node's (which wait for it to boot)
	// run side by side; newEnv's cleanups, the teardown, wait for both.
	t.Run("NetnsNodes", func(t *testing.T) {
		t.Parallel()
		e.netnsNodes(t, begin)
	})
	if e.vm != nil {
		t.Run("ProductionNode", func(t *testing.T) {
			t.Parallel()
			e.productionNode(t, begin)
		})
	}
}

// step runs f as the subtest name of t and logs its time.
func step(t *testing.T, name string, f func(t *testing.T)) bool {
	start := time.Now()
	ok := t.Run(name, f)
	t.Logf("%s: %s", name, time.Since(start).Round(100*time.Millisecond))
	return ok
}

// netnsNodes: the scenarios of the two netns nodes, in order.
func (e *env) netnsNodes(t *testing.T, begin time.Time) {
	if !step(t, "Node", e.node) || !step(t, "Deployment", e.deployment) {
		return
	}
	e.applyPods(t)
	step(t, "PodIPs", e.podIPs)
	step(t, "ClusterIPService", e.service)
	step(t, "DualStack", e.dualStack)
	step(t, "Logs", e.logs)
	step(t, "ExecCpAttachPortForward", e.streams)
	step(t, "Volumes", e.volumes)
	step(t, "ImageVolume", e.imageVolume)
	step(t, "Probes", e.probes)
	step(t, "OOMKilled", e.oom)
	step(t, "HostPortHostNetwork", e.hostAccess)
	step(t, "SeccompUserNamespace", e.security)
	step(t, "Limits", e.limits)
	step(t, "InPlaceResize", e.resize)
	step(t, "KubeletAsks", e.kubeletAsks)
	step(t, "Scale", e.scale)
	step(t, "RollingUpdate", e.rollingUpdate)
	step(t, "Job", e.job)
	step(t, "BerthdKilledDuringRollout", e.berthdKilled)
	step(t, "KubeletRestart", e.kubeletRestart)
	step(t, "TwoNodes", e.twoNodes)
	step(t, "Delete", e.deleteAll)
	step(t, "NoUnimplemented", e.noUnimplemented)
	t.Logf("scenarios done in %s (then the teardown)", time.Since(begin).Round(time.Second))
}

// node checks each node as kubectl shows it: Ready, berth's semantic
// version, a pod CIDR of its own from the controller-manager, which the
// node's berth now hands out on its bridge.
func (e *env) node(t *testing.T) {
	cidrs := map[netip.Prefix]string{}
	for _, n := range e.nodes {
		k := e.waitNodeReady(t, n.name, time.Minute)
		if v := k.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(v, "berth://0.") {
			t.Errorf("%s: runtime version %q, want berth://<semantic version>", n.name, v)
		}
		cidr, err := netip.ParsePrefix(k.Spec.PodCIDR)
		if err != nil || !netip.MustParsePrefix(clusterCIDR).Overlaps(cidr) {
			t.Fatalf("%s: pod CIDR %q (%v), want a /24 of %s", n.name, k.Spec.PodCIDR, err, clusterCIDR)
		}
		if other, ok := cidrs[cidr]; ok {
			t.Errorf("%s and %s have the same pod CIDR %s", other, n.name, cidr)
		}
		cidrs[cidr] = n.name
		kubeenv.WaitFor(t, time.Minute, n.name+"'s berth bridge in its pod CIDR", func() (bool, string) {
			out, _ := n.command("ip", "-o", "-4", "addr", "show", "dev", n.berthd.Bridge).CombinedOutput()
			for _, f := range strings.Fields(string(out)) {
				if p, err := netip.ParsePrefix(f); err == nil && cidr.Contains(p.Addr()) {
					return true, ""
				}
			}
			return false, string(out)
		})
	}
	e.apply(t, namespace)
	kubeenv.WaitFor(t, time.Minute, "the default service account of "+ns, func() (bool, string) {
		_, err := e.kubectlErr("get", "serviceaccount", "default", "-n", ns)
		return err == nil, fmt.Sprint(err)
	})
}

// waitNodeReady waits until node name is registered and Ready, with a pod CIDR.
func (e *env) waitNodeReady(t *testing.T, name string, timeout time.Duration) *corev1.Node {
	t.Helper()
	var n corev1.Node
	kubeenv.WaitFor(t, timeout, "node "+name+" Ready with a pod CIDR", func() (bool, string) {
		out, err := e.kubectlErr("get", "node", name, "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		n = corev1.Node{}
		if err := json.Unmarshal([]byte(out), &n); err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue && n.Spec.PodCIDR != "", fmt.Sprintf("Ready=%s (%s) podCIDR=%q", c.Status, c.Message, n.Spec.PodCIDR)
			}
		}
		return false, "no Ready condition yet"
	})
	return &n
}

const namespace = `apiVersion: v1
kind: Namespace
metadata:
  name: e2e
  labels:
    berth.test/cluster: "1"
`

// webDeployment serves "<version> <pod name>" on 8080, Ready once it answers.
const webDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: NAME
  namespace: e2e
spec:
  replicas: 3
  selector:
    matchLabels: {app: NAME}
  strategy:
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
  template:
    metadata:
      labels: {app: NAME}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: IMAGE
        command: ["/bin/web", "serve", ":8080"]
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
`

// applyReady applies a Deployment and returns the time from the apply to
// all its replicas Ready (kubectl rollout status).
func (e *env) applyReady(t *testing.T, name string) time.Duration {
	t.Helper()
	start := time.Now()
	e.apply(t, strings.ReplaceAll(webDeployment, "NAME", name))
	e.kubectl(t, "rollout", "status", "-n", ns, "deployment/"+name, "--timeout", startTimeout.String())
	return time.Since(start)
}

// deployment times a Deployment of 3 from apply to Ready: with an image
// berth has not pulled yet (cold), then another with the same image (warm).
func (e *env) deployment(t *testing.T) {
	cold := e.applyReady(t, "web")
	warm := e.applyReady(t, "warm")
	fmt.Printf("cluster: apply to 3 replicas Ready: cold image %s, warm image %s\n",
		cold.Round(time.Millisecond), warm.Round(time.Millisecond))
	e.kubectl(t, "delete", "-n", ns, "deployment/warm", "--wait=false")
	for _, p := range e.pods(t, ns, "app=web") {
		if !running(&p) {
			t.Errorf("after rollout status: %s", describe(&p))
		}
		c := p.Status.ContainerStatuses[0]
		if c.Image != e.imageV1 || !strings.HasPrefix(c.ImageID, strings.TrimSuffix(e.imageV1, ":v1")+"@sha256:") {
			t.Errorf("pod %s: image %q imageID %q, want %q and its repo digest", p.Name, c.Image, c.ImageID, e.imageV1)
		}
	}
}

// podIPs: each replica answers on its own pod IP, from the host (which
// routes each node's pod CIDR to it), and the summary API of the kubelet of
// its node counts that traffic in the pod's network stats.
func (e *env) podIPs(t *testing.T) {
	pods := e.pods(t, ns, "app=web")
	if len(pods) != 3 {
		t.Fatalf("%d pods of app=web, want 3", len(pods))
	}
	for _, p := range pods {
		body, err := kubeenv.Get(fmt.Sprintf("http://%s/", net.JoinHostPort(p.Status.PodIP, "8080")))
		if want := "v1 " + p.Name + "\n"; err != nil || body != want {
			t.Errorf("GET %s:8080 (%s): %q %v, want %q", p.Status.PodIP, p.Name, body, err, want)
		}
	}
	kubeenv.WaitFor(t, time.Minute, "network stats of the web pods in their kubelets' summaries", func() (bool, string) {
		counted := map[string]bool{}
		for _, n := range e.nodes {
			if err := e.countNetworkStats(n.name, counted); err != nil {
				return false, err.Error()
			}
		}
		for _, p := range pods {
			if !counted[p.Name] {
				return false, fmt.Sprintf("no rx/tx bytes for %s (on %s) in its node's summary", p.Name, p.Spec.NodeName)
			}
		}
		return true, ""
	})
}

// countNetworkStats marks in counted the pods of ns with received and sent
// bytes in node's kubelet's summary.
func (e *env) countNetworkStats(node string, counted map[string]bool) error {
	out, err := e.kubectlErr("get", "--raw", "/api/v1/nodes/"+node+"/proxy/stats/summary")
	if err != nil {
		return err
	}
	var summary struct {
		Pods []struct {
			PodRef struct {
				Name, Namespace string
			} `json:"podRef"`
			Network *struct {
				RxBytes, TxBytes uint64
			} `json:"network"`
		} `json:"pods"`
	}
	if err := json.Unmarshal([]byte(out), &summary); err != nil {
		return err
	}
	for _, p := range summary.Pods {
		if n := p.Network; p.PodRef.Namespace == ns && n != nil && n.RxBytes > 0 && n.TxBytes > 0 {
			counted[p.PodRef.Name] = true
		}
	}
	return nil
}

const webService = `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: e2e
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: client
    image: IMAGE
    command: ["sleep", "3600"]
`

// service: a ClusterIP Service reaches the replicas through kube-proxy's
// nftables rules, from each node and from another pod.
func (e *env) service(t *testing.T) {
	e.apply(t, webService)
	ip := strings.TrimSpace(e.kubectl(t, "get", "service", "-n", ns, "web", "-o", "jsonpath={.spec.clusterIP}"))
	names := map[string]bool{}
	for _, p := range e.pods(t, ns, "app=web") {
		names[p.Name] = true
	}
	check := func(from, body string, seen map[string]bool) {
		name, ok := strings.CutPrefix(strings.TrimSpace(body), "v1 ")
		if !ok || !names[name] {
			t.Errorf("GET %s from %s: %q, not a replica of web (%v)", ip, from, body, names)
		}
		seen[name] = true
	}
	url := "http://" + ip + "/"
	// Each request is a connection of its own (web get). kube-proxy may
	// program the replicas one by one as they become ready endpoints
	// (slowly on a loaded machine): wait until each node's requests have
	// reached two of them, which shows the load balancing.
	for _, n := range e.nodes {
		seen := map[string]bool{}
		kubeenv.WaitFor(t, time.Minute, "the Service from "+n.name+" reaching two replicas", func() (bool, string) {
			body, err := n.get(url)
			if err != nil {
				return false, err.Error()
			}
			check(n.name, body, seen)
			return len(seen) >= 2, fmt.Sprintf("replicas reached: %v", seen)
		})
	}
	e.waitPod(t, ns, "client", startTimeout, "Running", running)
	for range 5 {
		check("pod client", e.exec(t, ns, "client", "/bin/web", "get", url), map[string]bool{})
	}
}

// noUnimplemented: nothing the kubelet asked of berth during the run was
// answered Unimplemented (berthd logs those at WARN).
func (e *env) noUnimplemented(t *testing.T) {
	for _, n := range e.nodes {
		for _, l := range strings.Split(readFile(t, n.berthd.Log), "\n") {
			if strings.Contains(l, "code=Unimplemented") {
				t.Errorf("%s's berthd: %s", n.name, l)
			}
		}
	}
}
