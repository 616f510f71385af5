package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The second node: its addresses sit on the node link's side of a veth
// pair into a network namespace of its own.
const (
	node2Name = "berth-node-2"
	node2IP   = "172.29.255.2"
	node2IP6  = "fd29:29:ff::2"
)

// secondNode is a node in network and mount namespaces of its own, with
// its own berthd, kubelet and kube-proxy; the control plane stays on the
// host. The mount namespace is a slave of the host's: what the node mounts
// (berth's rootfs and pod folders, the kubelet's volumes) stays in it, and
// the kubelet's fixed host folders (/var/lib/kubelet/device-plugins, whose
// kubelet.sock every kubelet serves, and /var/log/containers) are bind
// mounts of the node's own folders there.
type secondNode struct {
	e        *env
	t        *testing.T // the step's: its cleanups take the node down
	work     *kubeenv.Work
	netns    string   // its name in /run/netns
	enter    []string // nsenter into the node's mount and network namespaces
	hostVeth string   // on the node link; its peer in the netns holds node2IP and node2IP6
	podCIDRs []string // routed by the host to node2IP and node2IP6
	holder   *kubeenv.Proc

	berthd      *kubeenv.Berthd
	conn        *grpc.ClientConn
	rt          runtimeapi.RuntimeServiceClient
	kubelet     *kubeenv.Proc
	kubeletRoot string
	cgroups     *kubeenv.Cgroups
	kubeProxy   *kubeenv.Proc
}

// startSecondNode starts the second node; t's cleanups take it down and
// delete its Node object.
func (e *env) startSecondNode(t *testing.T) *secondNode {
	t.Helper()
	pid := os.Getpid() % 100000
	n := &secondNode{e: e, t: t, netns: fmt.Sprintf("bc2-%d", pid), hostVeth: fmt.Sprintf("bcv%d", pid)}
	n.work = kubeenv.NewWork(t, "bc2-", "BERTH_CLUSTER_NODE2_LOGS")
	t.Cleanup(func() {
		n.keepLogs()
		n.work.Remove(t)
	})
	t.Cleanup(func() { n.cgroups.Remove(t) })
	t.Cleanup(n.removeNetwork)
	n.addNetwork(t)
	n.serveRegistry(t)
	n.startHolder(t)

	n.berthd = kubeenv.NewBerthd(t, n.work, e.binDir, fmt.Sprintf("bd%d", pid), "", e.reg.Host)
	n.berthd.InNamespaces(n.enter, n.netns)
	t.Cleanup(n.teardownBerth)
	t.Cleanup(func() { n.holder.Stop(syscall.SIGKILL, 10*time.Second) })
	n.berthd.Launch(t, answersVersion(n.berthd.Socket))
	conn, err := grpc.NewClient("unix://"+n.berthd.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	n.conn, n.rt = conn, runtimeapi.NewRuntimeServiceClient(conn)

	t.Cleanup(n.stopNode)
	n.kubeletRoot = n.work.Path("kubelet")
	n.cgroups = kubeenv.MakeCgroupRoot(t, fmt.Sprintf("/berth-cluster-%d-2", os.Getpid()))
	args, healthz := e.kubeletArgs(t, n.work, node2Name, node2IP, node2IP6, node2IP, n.cgroups, n.berthd.Socket)
	n.kubelet = kubeenv.Start(t, "kubelet-2", n.work.Path("kubelet.log"), append(slices.Clone(n.enter), args...)...)
	n.kubelet.WaitUp(t, 90*time.Second, func() error {
		_, err := kubeenv.Get(fmt.Sprintf("http://%s/healthz", net.JoinHostPort(node2IP, fmt.Sprint(healthz))))
		return err
	})
	// The host's way to the node's pods, in each family; the node's way
	// back is its route of the whole test range to the host.
	for _, cidr := range e.waitNamedNodeReady(t, node2Name, 2*time.Minute).Spec.PodCIDRs {
		n.ip(t, "route", "add", cidr, "via", node2Via(cidr), "dev", e.link)
		n.podCIDRs = append(n.podCIDRs, cidr)
	}

	config, proxyHealthz := e.kubeProxyConfig(t, n.work, node2Name, node2IP)
	n.kubeProxy = kubeenv.Start(t, "kube-proxy-2", n.work.Path("kube-proxy.log"),
		append(slices.Clone(n.enter), e.bin("kube-proxy"), "--config", config, "--v", "2")...)
	n.kubeProxy.WaitUp(t, time.Minute, func() error {
		if _, err := kubeenv.Get(fmt.Sprintf("http://%s/healthz", net.JoinHostPort(node2IP, fmt.Sprint(proxyHealthz)))); err != nil {
			return err
		}
		return n.berthd.NetCommand("nft", "list", "table", "ip", "kube-proxy").Run()
	})
	return n
}

// node2Via is the second node's address in the family of cidr.
func node2Via(cidr string) string {
	if strings.Contains(cidr, ":") {
		return node2IP6
	}
	return node2IP
}

// ip runs ip(8) on the host; a failure fails t.
func (n *secondNode) ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
	}
}

// addNetwork makes the node's network namespace and a veth pair from the
// node link into it: node2IP and node2IP6 on the node's end, which routes
// the test ranges (the control plane on nodeIP, the other node's pods, the
// Services) to the host, and forwards to its pods. The IPv6 address skips
// duplicate address detection, as the host's nodeIP6 does.
func (n *secondNode) addNetwork(t *testing.T) {
	t.Helper()
	const inner = "eth0"
	n.ip(t, "netns", "add", n.netns)
	n.ip(t, "link", "add", n.hostVeth, "type", "veth", "peer", "name", inner, "netns", n.netns)
	n.ip(t, "link", "set", n.hostVeth, "master", n.e.link, "up")
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", node2IP + "/32", "dev", inner},
		{"addr", "add", node2IP6 + "/128", "dev", inner, "nodad"},
		{"link", "set", inner, "up"},
		{"route", "add", nodeIP, "dev", inner},
		{"route", "add", testRange, "via", nodeIP, "dev", inner, "src", node2IP},
		{"route", "add", nodeIP6, "dev", inner},
		{"route", "add", testRange6, "via", nodeIP6, "dev", inner, "src", node2IP6},
	} {
		n.ip(t, append([]string{"-n", n.netns}, args...)...)
	}
	if out, err := exec.Command("nsenter", "--net=/run/netns/"+n.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		t.Fatalf("forwarding in %s: %v %s", n.netns, err, out)
	}
}

// removeNetwork removes the routes to the node's pods and its namespace
// (with its end of the veth pair, and so the host's).
func (n *secondNode) removeNetwork() {
	t := n.t
	for _, cidr := range n.podCIDRs {
		if out, err := exec.Command("ip", "route", "del", cidr, "via", node2Via(cidr)).CombinedOutput(); err != nil {
			t.Errorf("teardown: ip route del %s: %v %s", cidr, err, out)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", n.netns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
		t.Errorf("teardown: ip netns del %s: %v %s", n.netns, err, out)
	}
	kubeenv.WaitFor(t, 10*time.Second, n.hostVeth+" gone with the namespace", func() (bool, string) {
		_, err := net.InterfaceByName(n.hostVeth)
		return err != nil, "still there"
	})
}

// serveRegistry makes the host's loopback registry answer on the same
// address in the node's namespace, where berthd pulls the test images
// from: a listener opened in the namespace, whose connections are carried
// to the registry by the test process (in the host's).
func (n *secondNode) serveRegistry(t *testing.T) {
	t.Helper()
	ln, err := listenIn("/run/netns/"+n.netns, n.e.reg.Host)
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", n.e.reg.Host, n.netns, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r, err := net.Dial("tcp", n.e.reg.Host)
				if err != nil {
					return
				}
				defer r.Close()
				go func() { _, _ = io.Copy(r, c); r.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, r)
			}()
		}
	}()
}

// listenIn opens a TCP listener in the network namespace at nsPath: on a
// thread of its own that enters the namespace and comes back, or, if it
// cannot, dies with its goroutine (a locked thread is not reused).
func listenIn(nsPath, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer self.Close()
		target, err := os.Open(nsPath)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer target.Close()
		if err := setns(target); err != nil {
			done <- result{err: err}
			return
		}
		ln, err := net.Listen("tcp", addr)
		if setns(self) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{ln, err}
	}()
	r := <-done
	return r.ln, r.err
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

// startHolder starts the process that holds the node's mount namespace
// (made in its network namespace, a slave of the host's), with the
// kubelet's fixed host folders bound to the node's own; berthd, the kubelet
// and kube-proxy enter both namespaces through it.
func (n *secondNode) startHolder(t *testing.T) {
	t.Helper()
	binds := map[string]string{"/var/lib/kubelet/device-plugins": n.work.Path("device-plugins"), "/var/log/containers": n.work.Path("containers")}
	script := ""
	for target, source := range binds {
		kubeenv.Mkdirs(t, source, target)
		script += fmt.Sprintf("mount --bind %s %s && ", source, target)
	}
	n.holder = kubeenv.Start(t, "node-2 namespaces", n.work.Path("namespaces.log"), "nsenter", "--net=/run/netns/"+n.netns, "--",
		"unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script+"exec sleep 100000")
	n.holder.WaitUp(t, 10*time.Second, func() error {
		for target := range binds {
			if len(kubeenv.MountsUnderIn(fmt.Sprintf("/proc/%d/mountinfo", n.holder.PID()), target)) == 0 {
				return fmt.Errorf("%s not bound yet", target)
			}
		}
		return nil
	})
	n.enter = []string{"nsenter", "-t", fmt.Sprint(n.holder.PID()), "--mount", "--net", "--"}
}

// stopNode takes the node's pods down through its kubelet (deleting the
// workloads is the test's; what is left is reported), then stops kube-proxy
// and the kubelet and deletes the Node.
func (n *secondNode) stopNode() {
	t := n.t
	for _, p := range []*kubeenv.Proc{n.kubeProxy, n.kubelet} {
		if p == nil {
			continue
		}
		if !p.Stop(syscall.SIGTERM, 30*time.Second) {
			t.Errorf("teardown: %s did not stop within 30s of SIGTERM (killed)", p.Name)
		}
	}
	if out, err := n.e.kubectlErr("delete", "node", node2Name, "--wait=false"); err != nil {
		t.Errorf("teardown: %v %s", err, out)
	}
}

// teardownBerth removes the pods berthd still holds (a leak: reported),
// stops it and removes its bridge and tables in the node's namespace.
func (n *secondNode) teardownBerth() {
	t := n.t
	if n.berthd == nil || n.berthd.Proc == nil {
		return
	}
	if n.berthd.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if pods, err := n.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range pods.Items {
				t.Errorf("teardown: node 2's berth still holds pod %s (%s/%s)", p.Id, p.Metadata.GetNamespace(), p.Metadata.GetName())
				_, _ = n.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id})
			}
		}
		cancel()
	}
	n.berthd.Teardown(t)
	if n.conn != nil {
		n.conn.Close()
	}
}

// keepLogs copies the node's logs into the run's folder as node2-*.log,
// kept with the first node's.
func (n *secondNode) keepLogs() {
	logs, _ := filepath.Glob(n.work.Path("*.log"))
	for _, f := range logs {
		if b, err := os.ReadFile(f); err == nil {
			_ = os.WriteFile(n.e.path("node2-"+filepath.Base(f)), b, 0o644)
		}
	}
}

// leftovers is what the node's berth still holds of any pod.
func (n *secondNode) leftovers(t *testing.T) []string {
	t.Helper()
	return berthLeftovers(t, n.rt, n.berthd, n.kubeletRoot, n.cgroups)
}

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

// twoNodes starts a second node, in namespaces of its own, and shows the
// two working as one cluster: a Deployment spread over both, a pod on each
// reaching one on the other by IP, a Service reached from both nodes with
// endpoints on both; neither berth touching the other's bridge, tables,
// mounts or cgroups; and nothing left on the second once its pods are gone.
func (e *env) twoNodes(t *testing.T) {
	start := time.Now()
	n := e.startSecondNode(t)
	t.Logf("second node Ready in %s", time.Since(start).Round(100*time.Millisecond))

	start = time.Now()
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
	if len(byNode[nodeName]) != 2 || len(byNode[node2Name]) != 2 {
		t.Fatalf("replicas by node %v, want 2 on each of %s and %s", byNode, nodeName, node2Name)
	}
	n.ownsPods(t, byNode)
	e.isolated(t, n)

	// A pod on each node reaches a pod on the other by each of its IPs
	// (IPv4 and IPv6): routed by the host, no address translation (berth
	// masquerades nothing here, so the server sees the pod's own
	// address... and answers it).
	for _, pair := range [][2]string{{byNode[nodeName][0], byNode[node2Name][0]}, {byNode[node2Name][1], byNode[nodeName][1]}} {
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
	e.spreadService(t, n, byNode)

	e.kubectl(t, "delete", "-n", ns, "deployment/spread", "service/spread", "--wait=false")
	start = time.Now()
	kubeenv.WaitFor(t, 3*time.Minute, "node 2's berth empty after the delete", func() (bool, string) {
		left := n.leftovers(t)
		return len(left) == 0, strings.Join(left, "; ")
	})
	kubeenv.WaitFor(t, time.Minute, "node 1's berth without spread pods", func() (bool, string) {
		sbs, err := e.rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{
			Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "spread"}}})
		if err != nil {
			return false, err.Error()
		}
		return len(sbs.Items) == 0, fmt.Sprintf("%d spread pods", len(sbs.Items))
	})
	t.Logf("both berths without the spread pods %s after the delete", time.Since(start).Round(100*time.Millisecond))
}

// ownsPods: the second node's berth runs exactly the pods scheduled to it.
func (n *secondNode) ownsPods(t *testing.T, byNode map[string][]string) {
	t.Helper()
	sbs, err := n.rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{})
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
	want := slices.Sorted(slices.Values(byNode[node2Name]))
	if !slices.Equal(names, want) {
		t.Errorf("node 2's berth runs pods %v, want %v (those scheduled to %s)", names, want, node2Name)
	}
}

// isolated: each node's bridge, nftables tables, mounts and pod cgroups are
// where that node is, and nowhere of the other's.
func (e *env) isolated(t *testing.T, n *secondNode) {
	t.Helper()
	for _, c := range []struct {
		where  string
		run    func(string, ...string) *exec.Cmd
		own    *kubeenv.Berthd
		others *kubeenv.Berthd
	}{{"the host", exec.Command, e.berthd, n.berthd}, {"node 2's namespace", n.berthd.NetCommand, n.berthd, e.berthd}} {
		links, _ := c.run("ip", "-o", "link", "show").Output()
		tables, _ := c.run("nft", "list", "tables").Output()
		if !hasField(string(links), c.own.Bridge+":") || !hasTable(string(tables), "ip", c.own.Bridge) {
			t.Errorf("%s lacks its berth's bridge or table %s:\n%s\n%s", c.where, c.own.Bridge, links, tables)
		}
		if hasField(string(links), c.others.Bridge+":") || hasTable(string(tables), "ip", c.others.Bridge) || hasTable(string(tables), "netdev", c.others.Bridge) {
			t.Errorf("%s holds the other berth's bridge or table %s:\n%s\n%s", c.where, c.others.Bridge, links, tables)
		}
		if !hasTable(string(tables), "ip", "kube-proxy") {
			t.Errorf("%s has no kube-proxy table of its own:\n%s", c.where, tables)
		}
	}
	if ports := n.berthd.Ports(); len(ports) != 2 {
		t.Errorf("node 2's bridge %s has ports %v, want its 2 pods' veths", n.berthd.Bridge, ports)
	}
	// berth's mounts of node 2 are in its mount namespace only.
	if m := kubeenv.MountsUnder(n.work.Dir); len(m) != 0 {
		t.Errorf("the host sees node 2's mounts %v", m)
	}
	if m := kubeenv.MountsUnderIn(n.berthd.MountInfo(), n.work.Dir); len(m) == 0 {
		t.Errorf("node 2's namespace has no mounts below its folder %s", n.work.Dir)
	}
	// Each pod's cgroup is below its own node's kubelet's cgroup root.
	for _, p := range e.pods(t, ns, "app=spread") {
		for node, cg := range map[string]*kubeenv.Cgroups{nodeName: e.cgroups, node2Name: n.cgroups} {
			var found []string
			for _, h := range cg.Hierarchies {
				m, _ := filepath.Glob(filepath.Join(h, cg.Root, "kubepods", "*", "pod"+string(p.UID)))
				found = append(found, m...)
			}
			if onIt := p.Spec.NodeName == node; onIt != (len(found) > 0) {
				t.Errorf("pod %s on %s: cgroups below %s's root %s: %v", p.Name, p.Spec.NodeName, node, cg.Root, found)
			}
		}
	}
}

func hasField(out, field string) bool { return slices.Contains(strings.Fields(out), field) }

func hasTable(out, family, name string) bool {
	return slices.Contains(strings.Split(strings.TrimSpace(out), "\n"), "table "+family+" "+name)
}

// spreadService: the Service has endpoints on both nodes, and requests from
// either node reach replicas on both.
func (e *env) spreadService(t *testing.T, n *secondNode, byNode map[string][]string) {
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
		return ready[nodeName] == 2 && ready[node2Name] == 2, fmt.Sprintf("ready endpoints by node %v", ready)
	})
	ip := strings.TrimSpace(e.kubectl(t, "get", "service", "-n", ns, "spread", "-o", "jsonpath={.spec.clusterIP}"))
	url := "http://" + ip + "/"
	nodeOf := map[string]string{}
	for node, pods := range byNode {
		for _, p := range pods {
			nodeOf[p] = node
		}
	}
	for _, from := range []struct {
		name string
		get  func() (string, error)
	}{
		{"node 1", func() (string, error) { return kubeenv.Get(url) }},
		{"node 2", func() (string, error) {
			out, err := n.berthd.NetCommand(e.path("web"), "get", url).CombinedOutput()
			if err != nil {
				return "", errors.New(strings.TrimSpace(string(out)) + ": " + err.Error())
			}
			return string(out), nil
		}},
	} {
		reached := map[string]bool{}
		kubeenv.WaitFor(t, time.Minute, "the Service from "+from.name+" reaching replicas on both nodes", func() (bool, string) {
			body, err := from.get()
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
			return len(reached) == 2, fmt.Sprintf("nodes reached: %v", reached)
		})
	}
}
