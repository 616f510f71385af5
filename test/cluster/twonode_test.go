package cluster

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// spreadDeployment is webDeployment's server, four replicas spread evenly
// over the nodes, with its ClusterIP Service.
const spreadDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: spread
  namespace: e2e
spec:
  replicas: 4
  selector:
    matchLabels: {app: spread}
  template:
    metadata:
      labels: {app: spread}
    spec:
      terminationGracePeriodSeconds: 2
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        # The VM node's taint keeps it out of the spread's domains.
        nodeTaintsPolicy: Honor
        labelSelector:
          matchLabels: {app: spread}
      containers:
      - name: web
        image: IMAGE
        command: ["/bin/web", "serve", ":8080"]
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: spread
  namespace: e2e
spec:
  selector: {app: spread}
  ports: [{port: 80, targetPort: 8080}]
`

// twoNodes shows the two nodes working as one cluster: a Deployment spread
// over both, a pod on each reaching one on the other by IP, a Service
// reached from both nodes with endpoints on both; neither berth touching
// the other's bridge, tables, mounts or cgroups, nor the host's.
func (e *env) twoNodes(t *testing.T) {
	n1, n2 := e.nodes[0], e.nodes[1]
	start := time.Now()
	e.apply(t, spreadDeployment)
	e.kubectl(t, "rollout", "status", "-n", ns, "deployment/spread", "--timeout", startTimeout.String())
	t.Logf("spread Deployment Ready in %s", time.Since(start).Round(100*time.Millisecond))
	byNode := map[string][]string{} // node → pod names
	ips := map[string][]string{}    // pod → its IPs, IPv4 first
	for _, p := range e.pods(t, ns, "app=spread") {
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p.Name)
		for _, ip := range p.Status.PodIPs {
			ips[p.Name] = append(ips[p.Name], ip.IP)
		}
	}
	if len(byNode[n1.name]) != 2 || len(byNode[n2.name]) != 2 {
		t.Fatalf("replicas by node %v, want 2 on each of %s and %s", byNode, n1.name, n2.name)
	}
	for _, n := range e.nodes {
		n.ownsSpreadPods(t, byNode[n.name])
	}
	e.isolated(t)

	// A pod on each node reaches a pod on the other by each of its IPs
	// (IPv4 and IPv6): routed by the host, no address translation (berth
	// masquerades nothing here, so the server sees the pod's own
	// address... and answers it).
	for _, pair := range [][2]string{{byNode[n1.name][0], byNode[n2.name][0]}, {byNode[n2.name][1], byNode[n1.name][1]}} {
		from, to := pair[0], pair[1]
		if len(ips[to]) != 2 {
			t.Errorf("pod %s has IPs %v, want an IPv4 and an IPv6", to, ips[to])
		}
		for _, ip := range ips[to] {
			url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "8080"))
			if got, want := e.exec(t, ns, from, "/bin/web", "get", url), "v1 "+to+"\n"; got != want {
				t.Errorf("GET %s from pod %s: %q, want %q", url, from, got, want)
			}
		}
	}
	e.spreadService(t, byNode)

	// Each berth stops the spread pods of its node (the kubelets remove
	// their sandboxes a minute later; the Delete step sees that).
	e.kubectl(t, "delete", "-n", ns, "deployment/spread", "service/spread", "--wait=false")
	start = time.Now()
	for _, n := range e.nodes {
		kubeenv.WaitFor(t, 2*time.Minute, n.name+"'s berth without running spread pods", func() (bool, string) {
			sbs, err := n.rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{
				Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "spread"},
					State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
			if err != nil {
				return false, err.Error()
			}
			return len(sbs.Items) == 0, fmt.Sprintf("%d READY spread pods", len(sbs.Items))
		})
	}
	t.Logf("both berths stopped the spread pods %s after the delete", time.Since(start).Round(100*time.Millisecond))
}

// ownsSpreadPods: the node's berth runs exactly the spread pods scheduled
// to it.
func (n *node) ownsSpreadPods(t *testing.T, scheduled []string) {
	t.Helper()
	sbs, err := n.rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "spread"}}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sb := range sbs.Items {
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			names = append(names, sb.Metadata.GetName())
		}
	}
	slices.Sort(names)
	if want := slices.Sorted(slices.Values(scheduled)); !slices.Equal(names, want) {
		t.Errorf("%s's berth runs spread pods %v, want %v (those scheduled to it)", n.name, names, want)
	}
}

// isolated: each node's bridge, nftables tables (berth's and kube-proxy's),
// mounts and pod cgroups are where that node is, and nowhere of the other's
// or the host's.
func (e *env) isolated(t *testing.T) {
	t.Helper()
	type place struct {
		where string
		own   *node // nil for the host
		run   func(string, ...string) *exec.Cmd
	}
	places := []place{{"the host", nil, exec.Command}}
	for _, n := range e.nodes {
		places = append(places, place{n.name + "'s namespace", n, n.command})
	}
	for _, p := range places {
		links, _ := p.run("ip", "-o", "link", "show").Output()
		tables, _ := p.run("nft", "list", "tables").Output()
		for _, n := range e.nodes {
			bridge := n.berthd.Bridge
			has := hasField(string(links), bridge+":") || hasTable(string(tables), "ip", bridge) || hasTable(string(tables), "ip6", bridge) || hasTable(string(tables), "netdev", bridge)
			if n == p.own && !(hasField(string(links), bridge+":") && hasTable(string(tables), "ip", bridge) && hasTable(string(tables), "ip6", bridge)) {
				t.Errorf("%s lacks its berth's bridge or tables (ip, ip6) %s:\n%s\n%s", p.where, bridge, links, tables)
			}
			if n != p.own && has {
				t.Errorf("%s holds %s's berth bridge or table %s:\n%s\n%s", p.where, n.name, bridge, links, tables)
			}
		}
		for _, family := range []string{"ip", "ip6"} {
			if kp := hasTable(string(tables), family, "kube-proxy"); kp != (p.own != nil) {
				t.Errorf("%s: a kube-proxy table %s %v, want one only in a node's namespace:\n%s", p.where, family, kp, tables)
			}
		}
	}
	for _, n := range e.nodes {
		n.portsPerPod(t)
		// berth's mounts of a node are in its mount namespace only.
		if m := kubeenv.MountsUnder(n.work.Dir); len(m) != 0 {
			t.Errorf("the host sees %s's mounts %v", n.name, m)
		}
		for _, other := range e.nodes {
			m := kubeenv.MountsUnderIn(other.berthd.MountInfo(), n.work.Dir)
			if mine := other == n; mine != (len(m) > 0) {
				t.Errorf("%s's mount namespace: mounts below %s's folder %s: %v", other.name, n.name, n.work.Dir, m)
			}
		}
	}
	// Each pod's cgroup is below its own node's kubelet's cgroup root.
	for _, p := range e.pods(t, ns, "app=spread") {
		for _, n := range e.nodes {
			cg := n.cgroups
			var found []string
			for _, h := range cg.Hierarchies {
				m, _ := filepath.Glob(filepath.Join(h, cg.Root, "kubepods", "*", "pod"+string(p.UID)))
				found = append(found, m...)
			}
			if onIt := p.Spec.NodeName == n.name; onIt != (len(found) > 0) {
				t.Errorf("pod %s on %s: cgroups below %s's root %s: %v", p.Name, p.Spec.NodeName, n.name, cg.Root, found)
			}
		}
	}
}

// portsPerPod: the node's bridge has a port (a pod's veth) for each READY
// pod sandbox of its berth that has a network of its own.
func (n *node) portsPerPod(t *testing.T) {
	t.Helper()
	hostNetwork := map[string]bool{} // pod UIDs
	for _, p := range n.e.pods(t, ns, "") {
		if p.Spec.HostNetwork {
			hostNetwork[string(p.UID)] = true
		}
	}
	kubeenv.WaitFor(t, 30*time.Second, n.name+"'s bridge with a veth per pod", func() (bool, string) {
		sbs, err := n.rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{
			Filter: &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
		if err != nil {
			return false, err.Error()
		}
		want := 0
		for _, sb := range sbs.Items {
			if !hostNetwork[sb.Labels[uidLabel]] {
				want++
			}
		}
		ports := n.berthd.Ports()
		return len(ports) == want, fmt.Sprintf("bridge %s has ports %v, berth %d READY pods with a network", n.berthd.Bridge, ports, want)
	})
}

func hasField(out, field string) bool { return slices.Contains(strings.Fields(out), field) }

func hasTable(out, family, name string) bool {
	return slices.Contains(strings.Split(strings.TrimSpace(out), "\n"), "table "+family+" "+name)
}

// spreadService: the Service has endpoints on both nodes, and requests from
// either node reach replicas on both.
func (e *env) spreadService(t *testing.T, byNode map[string][]string) {
	t.Helper()
	kubeenv.WaitFor(t, time.Minute, "ready endpoints of spread on both nodes", func() (bool, string) {
		out, err := e.kubectlErr("get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=spread", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		var slices struct {
			Items []struct {
				Endpoints []struct {
					NodeName   string `json:"nodeName"`
					Conditions struct {
						Ready *bool `json:"ready"`
					} `json:"conditions"`
				} `json:"endpoints"`
			} `json:"items"`
		}
		if err := json.Unmarshal([]byte(out), &slices); err != nil {
			return false, err.Error()
		}
		ready := map[string]int{}
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready[ep.NodeName]++
				}
			}
		}
		for _, n := range e.nodes {
			if ready[n.name] != 2 {
				return false, fmt.Sprintf("ready endpoints by node %v", ready)
			}
		}
		return true, ""
	})
	ip := strings.TrimSpace(e.kubectl(t, "get", "service", "-n", ns, "spread", "-o", "jsonpath={.spec.clusterIP}"))
	url := "http://" + ip + "/"
	nodeOf := map[string]string{}
	for node, pods := range byNode {
		for _, p := range pods {
			nodeOf[p] = node
		}
	}
	for _, from := range e.nodes {
		reached := map[string]bool{}
		kubeenv.WaitFor(t, time.Minute, "the Service from "+from.name+" reaching replicas on both nodes", func() (bool, string) {
			body, err := from.get(url)
			if err != nil {
				return false, err.Error()
			}
			pod, _ := strings.CutPrefix(strings.TrimSpace(body), "v1 ")
			node, ok := nodeOf[pod]
			if !ok {
				t.Errorf("GET %s from %s: %q, not a replica of spread", url, from.name, body)
				return true, ""
			}
			reached[node] = true
			return len(reached) == len(e.nodes), fmt.Sprintf("nodes reached: %v", reached)
		})
	}
}
