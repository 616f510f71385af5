package cluster

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// dualStackService is a Service of the web replicas with a ClusterIP in
// each family, IPv4 first.
const dualStackService = `apiVersion: v1
kind: Service
metadata:
  name: web-dual
  namespace: e2e
spec:
  selector: {app: web}
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  ports: [{port: 80, targetPort: 8080}]
`

// dualStack: the cluster is dual-stack through berth. Each node has a pod
// CIDR in each family and its berth's bridge holds a gateway in both; each
// web replica has an IPv4 and an IPv6 address of its node's CIDRs, IPv4
// first, in the pod's status, `kubectl get pod -o wide` and its node's
// berth's PodSandboxStatus alike, and answers on its IPv6 from the host and
// from another pod; a RequireDualStack Service gets a ClusterIP in each
// family, and each reaches the replicas from each node and from another pod.
func (e *env) dualStack(t *testing.T) {
	cidrs := map[string][2]netip.Prefix{} // node → its pod CIDRs, IPv4 first
	for _, n := range e.nodes {
		cidr4, cidr6 := e.nodePodCIDRs(t, n.name)
		for family, cidr := range map[string]netip.Prefix{"-4": cidr4, "-6": cidr6} {
			if out, holds := n.bridgeHolds(family, cidr); !holds {
				t.Errorf("%s's berth bridge %s has no address in the node's pod CIDR %s:\n%s", n.name, n.berthd.Bridge, cidr, out)
			}
		}
		cidrs[n.name] = [2]netip.Prefix{cidr4, cidr6}
	}

	pods := e.pods(t, ns, "app=web")
	if len(pods) != 3 {
		t.Fatalf("%d pods of app=web, want 3", len(pods))
	}
	wide := e.wideIPs(t)
	for _, p := range pods {
		c := cidrs[p.Spec.NodeName]
		ips := podIPs(t, &p, c[0], c[1])
		if ips == nil {
			continue
		}
		if p.Status.PodIP != ips[0].String() || wide[p.Name] != ips[0].String() {
			t.Errorf("pod %s: status.podIP %q, kubectl -o wide %q, want its IPv4 %s", p.Name, p.Status.PodIP, wide[p.Name], ips[0])
		}
		e.nodeOf(t, &p).berthReportsIPs(t, &p, ips)
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(ips[1].String(), "8080"))
		want := "v1 " + p.Name + "\n"
		if body, err := kubeenv.Get(url); err != nil || body != want {
			t.Errorf("GET %s (%s) from the host: %q %v, want %q", url, p.Name, body, err, want)
		}
		if got := e.exec(t, ns, "client", "/bin/web", "get", url); got != want {
			t.Errorf("GET %s (%s) from pod client: %q, want %q", url, p.Name, got, want)
		}
	}
	e.dualStackService(t, pods)
}

// nodePodCIDRs are node name's pod CIDRs, one per family, IPv4 first, each
// within the cluster's range of its family.
func (e *env) nodePodCIDRs(t *testing.T, name string) (v4, v6 netip.Prefix) {
	t.Helper()
	n := e.waitNodeReady(t, name, time.Minute)
	if len(n.Spec.PodCIDRs) != 2 {
		t.Fatalf("%s: pod CIDRs %v, want one of %s and one of %s", name, n.Spec.PodCIDRs, clusterCIDR, clusterCIDR6)
	}
	v4, err4 := netip.ParsePrefix(n.Spec.PodCIDRs[0])
	v6, err6 := netip.ParsePrefix(n.Spec.PodCIDRs[1])
	if err4 != nil || err6 != nil || !netip.MustParsePrefix(clusterCIDR).Overlaps(v4) || !netip.MustParsePrefix(clusterCIDR6).Overlaps(v6) ||
		!v4.Addr().Is4() || !v6.Addr().Is6() || v6.Bits() != 64 {
		t.Fatalf("%s: pod CIDRs %v, want a /24 of %s and a /64 of %s", name, n.Spec.PodCIDRs, clusterCIDR, clusterCIDR6)
	}
	return v4, v6
}

// bridgeHolds reports whether the node's berth bridge has an address of
// family (-4 or -6) within cidr, with ip(8)'s list of its addresses.
func (n *node) bridgeHolds(family string, cidr netip.Prefix) (string, bool) {
	out, _ := n.command("ip", "-o", family, "addr", "show", "dev", n.berthd.Bridge).CombinedOutput()
	for _, f := range strings.Fields(string(out)) {
		if p, err := netip.ParsePrefix(f); err == nil && cidr.Contains(p.Addr()) {
			return string(out), true
		}
	}
	return string(out), false
}

// podIPs are pod p's status.podIPs, which must be an IPv4 of cidr4 then an
// IPv6 of cidr6 (nil, with t failed, when they are not).
func podIPs(t *testing.T, p *corev1.Pod, cidr4, cidr6 netip.Prefix) []netip.Addr {
	t.Helper()
	var ips []netip.Addr
	for _, ip := range p.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			t.Errorf("pod %s: status.podIPs %v: %v", p.Name, p.Status.PodIPs, err)
			return nil
		}
		ips = append(ips, a)
	}
	if len(ips) != 2 || !cidr4.Contains(ips[0]) || !cidr6.Contains(ips[1]) {
		t.Errorf("pod %s on %s: status.podIPs %v, want an IPv4 of %s then an IPv6 of %s", p.Name, p.Spec.NodeName, p.Status.PodIPs, cidr4, cidr6)
		return nil
	}
	return ips
}

// wideIPs is the IP column of `kubectl get pods -o wide` for the web pods,
// by pod name. The column is read at the header's offset: RESTARTS may
// hold spaces ("1 (5m ago)").
func (e *env) wideIPs(t *testing.T) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(e.kubectl(t, "get", "pods", "-n", ns, "-l", "app=web", "-o", "wide")), "\n")
	col := strings.Index(lines[0], " IP ") + 1
	if col == 0 {
		t.Fatalf("kubectl get pods -o wide has no IP column:\n%s", strings.Join(lines, "\n"))
	}
	ips := map[string]string{}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 0 && len(l) > col {
			ips[f[0]] = strings.Fields(l[col:])[0]
		}
	}
	return ips
}

// berthReportsIPs: the PodSandboxStatus of the node's berth for pod p (what
// `crictl inspectp` shows) has its IPv4 as network.ip and its IPv6 as the
// one additional IP, the order the kubelet took them in.
func (n *node) berthReportsIPs(t *testing.T, p *corev1.Pod, ips []netip.Addr) {
	t.Helper()
	for _, sb := range n.sandboxes(t, string(p.UID)) {
		if sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			continue
		}
		r, err := n.rt.PodSandboxStatus(kubeenv.Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.Id})
		if err != nil {
			t.Fatalf("PodSandboxStatus %s: %v", sb.Id, err)
		}
		network := r.Status.GetNetwork()
		if extra := network.GetAdditionalIps(); network.GetIp() != ips[0].String() || len(extra) != 1 || extra[0].GetIp() != ips[1].String() {
			t.Errorf("pod %s: %s's berth's PodSandboxStatus network %v, want ip %s and additional_ips [%s]", p.Name, n.name, network, ips[0], ips[1])
		}
		return
	}
	t.Errorf("pod %s: %s's berth holds no READY sandbox of it", p.Name, n.name)
}

// dualStackService: a RequireDualStack Service of the web replicas has a
// ClusterIP in each service range, IPv4 first, and each reaches replicas
// from each node and from pod client.
func (e *env) dualStackService(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	e.apply(t, dualStackService)
	defer e.kubectl(t, "delete", "-n", ns, "service/web-dual", "--wait=false")
	clusterIPs := strings.Fields(e.kubectl(t, "get", "service", "-n", ns, "web-dual", "-o", `jsonpath={.spec.clusterIPs[*]}`))
	if len(clusterIPs) != 2 || !inRange(clusterIPs[0], serviceCIDR) || !inRange(clusterIPs[1], serviceCIDR6) {
		t.Fatalf("web-dual clusterIPs %v, want one of %s then one of %s", clusterIPs, serviceCIDR, serviceCIDR6)
	}
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
	}
	isReplica := func(body string) bool {
		name, ok := strings.CutPrefix(strings.TrimSpace(body), "v1 ")
		return ok && names[name]
	}
	for _, ip := range clusterIPs {
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, "80"))
		// Each node's kube-proxy programs the new Service in each family
		// on its own.
		for _, n := range e.nodes {
			kubeenv.WaitFor(t, time.Minute, "the Service's ClusterIP "+ip+" from "+n.name, func() (bool, string) {
				body, err := n.get(url)
				if err != nil {
					return false, err.Error()
				}
				if !isReplica(body) {
					t.Errorf("GET %s from %s: %q, not a replica of web (%v)", url, n.name, body, names)
				}
				return true, ""
			})
		}
		for range 3 {
			if body := e.exec(t, ns, "client", "/bin/web", "get", url); !isReplica(body) {
				t.Errorf("GET %s from pod client: %q, not a replica of web (%v)", url, body, names)
			}
		}
	}
}

// inRange reports whether ip is an address of cidr.
func inRange(ip, cidr string) bool {
	a, err := netip.ParseAddr(ip)
	return err == nil && netip.MustParsePrefix(cidr).Contains(a)
}
