package cluster

import (
	"context"
	"errors"
	"fmt"
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
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The nodes, both schedulable: node i (from 1) holds 172.29.255.(1+i) and
// fd29:29:ff::(1+i), on its end of a veth pair from the host's node link
// (which holds hostIP and hostIP6).
var nodeNames = []string{"berth-node", "berth-node-2"}

// node is one node of the cluster, in network and mount namespaces of its
// own, with its own berthd, kubelet and kube-proxy; the control plane stays
// on the host. The mount namespace is a slave of the host's: what the node
// mounts (berth's rootfs and pod folders, the kubelet's volumes) stays in
// it, and the kubelet's fixed host folders (/var/lib/kubelet/device-plugins,
// whose kubelet.sock every kubelet serves, and /var/log/containers) are
// bind mounts of the node's own folders there.
type node struct {
	e        *env
	name     string
	ip, ip6  string
	work     *kubeenv.Work // the node's own folder, /tmp/bcN-*
	netns    string        // its name in /run/netns
	enter    []string      // nsenter into the node's mount and network namespaces
	hostVeth string        // on the node link; its peer in the netns holds ip and ip6
	podCIDRs []string      // routed by the host to ip and ip6, IPv4 first
	holder   *kubeenv.Proc // holds the mount namespace

	berthd *kubeenv.Berthd
	conn   *grpc.ClientConn
	rt     runtimeapi.RuntimeServiceClient

	kubelet     *kubeenv.Proc
	kubeletArgs []string
	healthz     int // the kubelet's, on ip
	kubeletRoot string
	cgroups     *kubeenv.Cgroups // the kubelet's cgroupRoot, "/berth-cluster-PID-N"
	kubeProxy   *kubeenv.Proc
}

// startNodes starts every node: their berthds and kubelets first, then,
// once each is Ready with its pod CIDR, the host's route to its pods and
// its kube-proxy. Each node's cleanups (on e.t) take it down; the one
// registered last deletes the tests' namespaces before any node stops.
func (e *env) startNodes() {
	t := e.t
	t.Helper()
	for i, name := range nodeNames {
		e.nodes = append(e.nodes, e.startNode(i+1, name))
	}
	t.Cleanup(e.deleteTestNamespaces)
	for _, n := range e.nodes {
		n.join()
	}
}

// startNode makes node number index's namespaces and starts its berthd and
// kubelet.
func (e *env) startNode(index int, name string) *node {
	t := e.t
	t.Helper()
	pid := os.Getpid() % 100000
	suffix := fmt.Sprintf("%dn%d", pid, index)
	n := &node{e: e, name: name, ip: fmt.Sprintf("172.29.255.%d", 1+index), ip6: fmt.Sprintf("fd29:29:ff::%d", 1+index),
		netns: "bc" + suffix, hostVeth: "bcv" + suffix}
	n.work = kubeenv.NewWork(t, fmt.Sprintf("bc%d-", index), "") // its logs go with the run's (keepLogs)
	t.Cleanup(func() {
		n.keepLogs()
		n.work.Remove(t)
	})
	t.Cleanup(func() { n.cgroups.Remove(t) })
	t.Cleanup(n.removeNetwork)
	n.addNetwork()
	n.serveRegistry()
	n.startHolder()

	// A bridge and nftables table of the node's own; no subnet, so that the
	// node's pod CIDR the kubelet passes on is the one pods get.
	n.berthd = kubeenv.NewBerthd(t, n.work, e.binDir, "bc"+suffix, "", e.reg.Host)
	n.berthd.InNamespaces(n.enter, n.netns)
	t.Cleanup(n.teardownBerth)
	t.Cleanup(func() { n.holder.Stop(syscall.SIGKILL, 10*time.Second) })
	n.launchBerthd()
	conn, err := grpc.NewClient("unix://"+n.berthd.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	n.conn, n.rt = conn, runtimeapi.NewRuntimeServiceClient(conn)

	t.Cleanup(n.stop)
	n.kubeletRoot = n.work.Path("kubelet")
	n.cgroups = kubeenv.MakeCgroupRoot(t, fmt.Sprintf("/berth-cluster-%d-%d", os.Getpid(), index))
	n.kubeletArgs, n.healthz = e.kubeletArgs(t, n.work, n.name, n.ip, n.ip6, n.cgroups, n.berthd.Socket)
	n.launchKubelet()
	return n
}

// join waits until the node is Ready with its pod CIDRs, routes them to
// the node and starts its kube-proxy.
func (n *node) join() {
	t, e := n.e.t, n.e
	t.Helper()
	// The host's way to the node's pods, in each family; the node's way
	// back is its route of the whole test ranges to the host.
	for _, cidr := range e.waitNodeReady(t, n.name, 2*time.Minute).Spec.PodCIDRs {
		ipCmd(t, "route", "add", cidr, "via", n.via(cidr), "dev", e.link)
		n.podCIDRs = append(n.podCIDRs, cidr)
	}

	config, healthz := e.kubeProxyConfig(t, n.work, n.name, n.ip)
	n.kubeProxy = kubeenv.Start(t, "kube-proxy "+n.name, n.work.Path("kube-proxy.log"),
		append(slices.Clone(n.enter), e.bin("kube-proxy"), "--config", config, "--v", "2")...)
	n.kubeProxy.WaitUp(t, time.Minute, func() error {
		if _, err := kubeenv.Get(fmt.Sprintf("http://%s/healthz", net.JoinHostPort(n.ip, fmt.Sprint(healthz)))); err != nil {
			return err
		}
		if err := n.command("nft", "list", "table", "ip", "kube-proxy").Run(); err != nil {
			return err
		}
		return n.command("nft", "list", "table", "ip6", "kube-proxy").Run()
	})
}

// via is the node's address in the family of cidr.
func (n *node) via(cidr string) string {
	if strings.Contains(cidr, ":") {
		return n.ip6
	}
	return n.ip
}

// launchBerthd starts the node's berthd (again, after a kill) and waits
// until its socket answers Version.
func (n *node) launchBerthd() {
	n.berthd.Launch(n.e.t, answersVersion(n.berthd.Socket))
}

// launchKubelet starts the node's kubelet (again, after a stop) and waits
// until its healthz answers.
func (n *node) launchKubelet() {
	t := n.e.t
	t.Helper()
	n.kubelet = kubeenv.Start(t, "kubelet "+n.name, n.work.Path("kubelet.log"), append(slices.Clone(n.enter), n.kubeletArgs...)...)
	n.kubelet.WaitUp(t, 90*time.Second, func() error {
		_, err := kubeenv.Get(fmt.Sprintf("http://%s/healthz", net.JoinHostPort(n.ip, fmt.Sprint(n.healthz))))
		return err
	})
}

// command is name with args run in the node's network namespace.
func (n *node) command(name string, args ...string) *exec.Cmd {
	return n.berthd.NetCommand(name, args...)
}

// get is an HTTP GET of url from the node's network namespace (the test's
// web client), the body or an error with the client's output.
func (n *node) get(url string) (string, error) {
	out, err := n.command(n.e.path("web"), "get", url).CombinedOutput()
	if err != nil {
		return "", errors.New(strings.TrimSpace(string(out)) + ": " + err.Error())
	}
	return string(out), nil
}

// ipCmd runs ip(8) on the host; a failure fails t.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
	}
}

// addNetwork makes the node's network namespace and a veth pair from the
// node link into it: the node's addresses on its end, which routes the test
// ranges (the control plane on hostIP, the other node's pods, the Services)
// to the host, and forwards to its pods. The IPv6 address skips duplicate
// address detection, as the host's hostIP6 does.
func (n *node) addNetwork() {
	t := n.e.t
	t.Helper()
	const inner = "eth0"
	ipCmd(t, "netns", "add", n.netns)
	ipCmd(t, "link", "add", n.hostVeth, "type", "veth", "peer", "name", inner, "netns", n.netns)
	ipCmd(t, "link", "set", n.hostVeth, "master", n.e.link, "up")
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", n.ip + "/32", "dev", inner},
		{"addr", "add", n.ip6 + "/128", "dev", inner, "nodad"},
		{"link", "set", inner, "up"},
		{"route", "add", hostIP, "dev", inner},
		{"route", "add", testRange, "via", hostIP, "dev", inner, "src", n.ip},
		{"route", "add", hostIP6, "dev", inner},
		{"route", "add", testRange6, "via", hostIP6, "dev", inner, "src", n.ip6},
	} {
		ipCmd(t, append([]string{"-n", n.netns}, args...)...)
	}
	if out, err := exec.Command("nsenter", "--net=/run/netns/"+n.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		t.Fatalf("forwarding in %s: %v %s", n.netns, err, out)
	}
}

// removeNetwork removes the routes to the node's pods and its namespace
// (with its end of the veth pair, and so the host's).
func (n *node) removeNetwork() {
	t := n.e.t
	for _, cidr := range n.podCIDRs {
		if out, err := exec.Command("ip", "route", "del", cidr, "via", n.via(cidr)).CombinedOutput(); err != nil {
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
func (n *node) serveRegistry() {
	t, reg := n.e.t, n.e.reg.Host
	t.Helper()
	ln, err := listenIn("/run/netns/"+n.netns, reg)
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", reg, n.netns, err)
	}
	t.Cleanup(func() { ln.Close() })
	go forward(ln, reg)
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
func (n *node) startHolder() {
	t := n.e.t
	t.Helper()
	binds := map[string]string{"/var/lib/kubelet/device-plugins": n.work.Path("device-plugins"), "/var/log/containers": n.work.Path("containers")}
	script := ""
	for target, source := range binds {
		kubeenv.Mkdirs(t, source, target)
		script += fmt.Sprintf("mount --bind %s %s && ", source, target)
	}
	n.holder = kubeenv.Start(t, n.name+" namespaces", n.work.Path("namespaces.log"), "nsenter", "--net=/run/netns/"+n.netns, "--",
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

// deleteTestNamespaces deletes every object the tests made, so that the
// kubelets take their pods down through berth the way a node does, and
// waits until no berth holds a pod.
func (e *env) deleteTestNamespaces() {
	t := e.t
	if e.apiserver == nil || !e.apiserver.Running() {
		return
	}
	if out, err := e.kubectlErr("delete", "namespace", "-l", testLabel, "--wait=false"); err != nil {
		t.Errorf("teardown: %v %s", err, out)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for _, n := range e.nodes {
		for n.kubelet != nil && n.kubelet.Running() && time.Now().Before(deadline) {
			if count, err := n.berthPodCount(); err == nil && count == 0 {
				break
			}
			time.Sleep(2 * time.Second)
		}
	}
}

func (n *node) berthPodCount() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := n.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, err
	}
	return len(r.Items), nil
}

// stop stops the node's kube-proxy and kubelet (its pods went with the
// tests' namespaces; what is left is reported by teardownBerth) and deletes
// its Node.
func (n *node) stop() {
	t := n.e.t
	for _, p := range []*kubeenv.Proc{n.kubeProxy, n.kubelet} {
		if p == nil {
			continue
		}
		if !p.Stop(syscall.SIGTERM, 30*time.Second) {
			t.Errorf("teardown: %s did not stop within 30s of SIGTERM (killed)", p.Name)
		}
		if t.Failed() {
			t.Logf("%s log (last 100 lines):\n%s", p.Name, p.Tail(100))
		}
	}
	if n.e.apiserver != nil && n.e.apiserver.Running() {
		if out, err := n.e.kubectlErr("delete", "node", n.name, "--wait=false"); err != nil {
			t.Errorf("teardown: %v %s", err, out)
		}
	}
}

// teardownBerth removes the pods berthd still holds (a leak: reported),
// stops it and removes its bridge and tables in the node's namespace.
func (n *node) teardownBerth() {
	t := n.e.t
	if n.berthd == nil || n.berthd.Proc == nil {
		return
	}
	if n.berthd.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if pods, err := n.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range pods.Items {
				t.Errorf("teardown: %s's berth still holds pod %s (%s/%s)", n.name, p.Id, p.Metadata.GetNamespace(), p.Metadata.GetName())
				if _, err := n.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
					t.Errorf("teardown: remove pod %s: %v", p.Id, err)
				}
			}
		} else {
			t.Errorf("teardown: list %s's pods: %v", n.name, err)
		}
		cancel()
	}
	n.berthd.Teardown(t)
	if n.conn != nil {
		n.conn.Close()
	}
}

// keepLogs copies the node's logs into the run's folder as NAME-*.log,
// kept with the control plane's.
func (n *node) keepLogs() {
	logs, _ := filepath.Glob(n.work.Path("*.log"))
	for _, f := range logs {
		if b, err := os.ReadFile(f); err == nil {
			_ = os.WriteFile(n.e.path(n.name+"-"+filepath.Base(f)), b, 0o644)
		}
	}
}

// nodeOf is the node pod p is scheduled to.
func (e *env) nodeOf(t *testing.T, p *corev1.Pod) *node {
	t.Helper()
	for _, n := range e.nodes {
		if n.name == p.Spec.NodeName {
			return n
		}
	}
	t.Fatalf("pod %s is on node %q, not one of the cluster's", p.Name, p.Spec.NodeName)
	return nil
}

// leftovers is what the node's berth still holds of any pod.
func (n *node) leftovers(t *testing.T) []string {
	t.Helper()
	return berthLeftovers(t, n.rt, n.berthd, n.kubeletRoot, n.cgroups)
}
