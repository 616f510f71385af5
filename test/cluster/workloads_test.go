package cluster

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// readyWeb is the number of web pods Running and Ready, and how many of
// them the berth of their node holds as READY sandboxes.
func (e *env) readyWeb(t *testing.T) (pods, sandboxes int) {
	t.Helper()
	for _, p := range e.pods(t, ns, "app=web") {
		if p.DeletionTimestamp == nil && running(&p) {
			pods++
			for _, sb := range e.nodeOf(t, &p).sandboxes(t, string(p.UID)) {
				if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
					sandboxes++
				}
			}
		}
	}
	return pods, sandboxes
}

// sandboxes are the node's berth's sandboxes of the pod with uid.
func (n *node) sandboxes(t *testing.T, uid string) []*runtimeapi.PodSandbox {
	t.Helper()
	r, err := n.rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{uidLabel: uid}}})
	if err != nil {
		t.Fatalf("ListPodSandbox: %v", err)
	}
	return r.Items
}

// scale: kubectl scale up to 5 and down to 2; berth follows.
func (e *env) scale(t *testing.T) {
	for _, n := range []int{5, 2} {
		e.kubectl(t, "scale", "-n", ns, "deployment/web", fmt.Sprintf("--replicas=%d", n))
		e.kubectl(t, "rollout", "status", "-n", ns, "deployment/web", "--timeout", startTimeout.String())
		kubeenv.WaitFor(t, time.Minute, fmt.Sprintf("%d web pods, each with a READY sandbox in berth", n), func() (bool, string) {
			pods, sbs := e.readyWeb(t)
			all := len(e.pods(t, ns, "app=web"))
			return pods == n && sbs == n && all == n, fmt.Sprintf("%d ready pods, %d READY sandboxes, %d pods", pods, sbs, all)
		})
	}
	e.kubectl(t, "scale", "-n", ns, "deployment/web", "--replicas=3")
	e.kubectl(t, "rollout", "status", "-n", ns, "deployment/web", "--timeout", startTimeout.String())
}

// rollingUpdate: kubectl set image to v2; every replica then answers v2.
func (e *env) rollingUpdate(t *testing.T) {
	e.kubectl(t, "set", "image", "-n", ns, "deployment/web", "web="+e.imageV2)
	e.kubectl(t, "rollout", "status", "-n", ns, "deployment/web", "--timeout", startTimeout.String())
	e.checkVersion(t, "v2")
}

// checkVersion checks every web pod is Ready and answers version on its IP.
func (e *env) checkVersion(t *testing.T, version string) {
	t.Helper()
	kubeenv.WaitFor(t, time.Minute, "3 web pods, all Ready and serving "+version, func() (bool, string) {
		pods := e.pods(t, ns, "app=web")
		var bad []string
		for _, p := range pods {
			body, err := kubeenv.Get(fmt.Sprintf("http://%s:8080/", p.Status.PodIP))
			if !running(&p) || err != nil || body != version+" "+p.Name+"\n" {
				bad = append(bad, fmt.Sprintf("%s: %q %v", describe(&p), body, err))
			}
		}
		return len(pods) == 3 && len(bad) == 0, fmt.Sprintf("%d pods, not right: %v", len(pods), bad)
	})
}

const jobYAML = `apiVersion: batch/v1
kind: Job
metadata: {name: count, namespace: e2e}
spec:
  completions: 2
  parallelism: 2
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 0
      containers:
      - name: count
        image: IMAGE
        command: ["sh", "-c", "seq 3"]
`

// job: a Job of 2 completions runs to Complete; its pods' logs are theirs.
func (e *env) job(t *testing.T) {
	e.apply(t, jobYAML)
	e.kubectl(t, "wait", "-n", ns, "--for=condition=Complete", "job/count", "--timeout", startTimeout.String())
	pods := e.pods(t, ns, "job-name=count")
	succeeded := 0
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded {
			succeeded++
			if out := e.kubectl(t, "logs", "-n", ns, p.Name); out != "1\n2\n3\n" {
				t.Errorf("logs of %s: %q", p.Name, out)
			}
		}
	}
	if succeeded != 2 {
		t.Errorf("%d of the job's %d pods Succeeded, want 2", succeeded, len(pods))
	}
}

// berthdKilled: the berthd of the node of the rollout's first new pod is
// SIGKILLed while the rollout (back to v1) is under way and started again;
// the rollout completes and no pod is lost, on either node.
func (e *env) berthdKilled(t *testing.T) {
	type placed struct{ uid, node string }
	others := map[string]placed{} // every other Running pod by name
	for _, p := range e.pods(t, ns, "") {
		if p.Status.Phase == corev1.PodRunning && p.Labels["app"] != "web" {
			others[p.Name] = placed{string(p.UID), p.Spec.NodeName}
		}
	}
	e.kubectl(t, "set", "image", "-n", ns, "deployment/web", "web="+e.imageV1)
	// Kill it once the rollout has scheduled its first new pod.
	var killed *node
	kubeenv.WaitFor(t, time.Minute, "a v1 pod of the rollout on a node", func() (bool, string) {
		for _, p := range e.pods(t, ns, "app=web") {
			if p.Spec.Containers[0].Image == e.imageV1 && p.Spec.NodeName != "" {
				killed = e.nodeOf(t, &p)
				return true, ""
			}
		}
		return false, "none yet"
	})
	if err := syscall.Kill(killed.berthd.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-killed.berthd.Done()
	t.Logf("killed %s's berthd", killed.name)
	time.Sleep(2 * time.Second)
	killed.launchBerthd()
	e.kubectl(t, "rollout", "status", "-n", ns, "deployment/web", "--timeout", startTimeout.String())
	e.checkVersion(t, "v1")
	kubeenv.WaitFor(t, time.Minute, "every other pod still Running, on the same READY sandbox of its node's berth", func() (bool, string) {
		var lost []string
		for name, was := range others {
			p, err := e.kubectlErr("get", "pod", "-n", ns, name, "-o", "jsonpath={.status.phase} {.metadata.uid} {.spec.nodeName}")
			ready := 0
			for _, n := range e.nodes {
				if n.name == was.node {
					for _, sb := range n.sandboxes(t, was.uid) {
						if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
							ready++
						}
					}
				}
			}
			if err != nil || p != "Running "+was.uid+" "+was.node || ready != 1 {
				lost = append(lost, fmt.Sprintf("%s: %q %v, %d READY sandboxes on %s", name, p, err, ready, was.node))
			}
		}
		return len(lost) == 0, fmt.Sprint(lost)
	})
}

// kubeletRestart: every node's kubelet stops and starts again; the nodes
// come back Ready, the pods keep their containers (no restart), and new
// pods run.
func (e *env) kubeletRestart(t *testing.T) {
	restarts := map[string]int32{}
	for _, p := range e.pods(t, ns, "app=web") {
		restarts[p.Name] = p.Status.ContainerStatuses[0].RestartCount
	}
	for _, n := range e.nodes {
		if !n.kubelet.Stop(syscall.SIGTERM, 30*time.Second) {
			t.Errorf("%s's kubelet did not stop within 30s of SIGTERM (killed)", n.name)
		}
		n.launchKubelet()
	}
	for _, n := range e.nodes {
		e.waitNodeReady(t, n.name, 2*time.Minute)
	}
	for name, n := range restarts {
		p := e.waitPod(t, ns, name, time.Minute, "Running and Ready", running)
		if got := p.Status.ContainerStatuses[0].RestartCount; got != n {
			t.Errorf("%s: restart count %d after the kubelet's restart, was %d", name, got, n)
		}
	}
	e.kubectl(t, "scale", "-n", ns, "deployment/web", "--replicas=4")
	e.kubectl(t, "rollout", "status", "-n", ns, "deployment/web", "--timeout", startTimeout.String())
}

// deleteAll: kubectl delete of every workload; within the kubelets' cleanup
// period neither node's berth holds a pod or container, and no mount, veth,
// IP lease or cgroup of a pod remains on either node, nor a mount of a node
// on the host.
func (e *env) deleteAll(t *testing.T) {
	e.kubectl(t, "delete", "-n", ns, "deployment,job,pod,service", "--all", "--wait=false")
	start := time.Now()
	defer func() {
		if t.Failed() {
			out, err := e.kubectlErr("get", "pods", "-A", "-o", "wide")
			t.Logf("pods the API server still has: %v\n%s", err, out)
		}
	}()
	// What is left is logged each time it changes: a run that fails here
	// shows which part of the teardown stalled, and from when.
	var last string
	kubeenv.WaitFor(t, 3*time.Minute, "both berths empty after kubectl delete", func() (bool, string) {
		left := e.leftoversOnNodes(t)
		summary := summarizeLeftovers(left)
		if summary != last {
			t.Logf("%s after the delete: %s", time.Since(start).Round(100*time.Millisecond), summary)
			last = summary
		}
		return len(left) == 0, summary + ": " + strings.Join(left, "; ")
	})
	t.Logf("both berths empty %s after the delete", time.Since(start).Round(100*time.Millisecond))
}

// leftoversOnNodes is what the nodes' berths still hold of any pod, and
// the mounts of the nodes left on the host.
func (e *env) leftoversOnNodes(t *testing.T) []string {
	var left []string
	for _, n := range e.nodes {
		for _, l := range n.leftovers(t) {
			left = append(left, n.name+": "+l)
		}
		for _, m := range kubeenv.MountsUnder(n.work.Dir) {
			left = append(left, "the host: mount "+m)
		}
	}
	return left
}

// summarizeLeftovers counts leftoversOnNodes' lines by node and kind
// ("berth-node: 3 pod, 2 mount"), in their order.
func summarizeLeftovers(left []string) string {
	var keys []string
	count := map[string]int{}
	for _, l := range left {
		node, what, _ := strings.Cut(l, ": ")
		kind, _, _ := strings.Cut(what, " ")
		if strings.HasPrefix(kind, "/") {
			kind = "folder"
		}
		key := node + ": " + kind
		if count[key] == 0 {
			keys = append(keys, key)
		}
		count[key]++
	}
	var parts []string
	for _, k := range keys {
		node, kind, _ := strings.Cut(k, ": ")
		parts = append(parts, fmt.Sprintf("%s: %d %s", node, count[k], kind))
	}
	return strings.Join(parts, ", ")
}

// berthLeftovers lists what the berth b of a node (rt its CRI client) still
// holds of any pod, with the kubelet's volume mounts below kubeletRoot and
// the pod cgroups below the kubelet's cgroup root.
func berthLeftovers(t *testing.T, rt runtimeapi.RuntimeServiceClient, b *kubeenv.Berthd, kubeletRoot string, cgroups *kubeenv.Cgroups) []string {
	t.Helper()
	var left []string
	sbs, err := rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return []string{err.Error()}
	}
	for _, sb := range sbs.Items {
		left = append(left, "pod "+sb.Metadata.GetName())
	}
	cs, err := rt.ListContainers(kubeenv.Ctx(t), &runtimeapi.ListContainersRequest{})
	if err != nil {
		return []string{err.Error()}
	}
	for _, c := range cs.Containers {
		left = append(left, "container "+c.Metadata.GetName())
	}
	left = append(left, b.Leftovers()...)
	// The kubelet's volume mounts, below its root (a bind mount of itself).
	for _, m := range kubeenv.MountsUnderIn(b.MountInfo(), kubeletRoot, kubeletRoot) {
		left = append(left, "mount "+m)
	}
	for _, h := range cgroups.Hierarchies {
		pods, _ := filepath.Glob(filepath.Join(h, cgroups.Root, "kubepods", "*", "pod*"))
		guaranteed, _ := filepath.Glob(filepath.Join(h, cgroups.Root, "kubepods", "pod*"))
		for _, p := range append(pods, guaranteed...) {
			left = append(left, "cgroup "+p)
		}
	}
	return left
}
