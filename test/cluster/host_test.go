package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// checkHost refuses a host where the run would collide with what is there:
// a route into the test range or a kube-proxy's tables (kubeenv.RecordHost
// refuses one where a kubelet runs).
func checkHost(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ip", "-o", "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("ip route: %v %s", err, out)
	}
	test := netip.MustParsePrefix(testRange)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && slices.Contains([]string{"local", "broadcast", "unicast", "multicast", "anycast",
			"unreachable", "blackhole", "prohibit", "throw"}, f[0]) {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		p, err := netip.ParsePrefix(f[0])
		if err != nil {
			if a, err2 := netip.ParseAddr(f[0]); err2 == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				continue
			}
		}
		if p.Bits() > 0 && p.Overlaps(test) {
			t.Fatalf("the host routes %s, inside the tier's range %s: %s", p, testRange, line)
		}
	}
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
			t.Fatalf("nftables table %s kube-proxy exists: a kube-proxy runs on this host", family)
		}
	}
}

// addNodeLink makes the link that holds the control plane's address, to
// which the nodes' veths are joined, and routes the whole test range to
// it: an address of the range no node, pod or Service holds goes nowhere,
// never out of the host. The host forwards between the nodes (it routes
// each node's pod CIDR to it): ip_forward on, restored at the end.
func (e *env) addNodeLink() {
	t := e.t
	t.Helper()
	link := fmt.Sprintf("bcn%d", os.Getpid()%100000)
	for i, args := range [][]string{
		{"link", "add", link, "type", "bridge"},
		{"addr", "add", hostIP + "/32", "dev", link},
		{"link", "set", link, "up"},
		{"route", "add", testRange, "dev", link},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
		}
		if i == 0 {
			e.link = link
		}
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// restoreHost removes the node link, kube-proxy's tables (a leak: the
// nodes' kube-proxies make theirs in their namespaces), the kubelet's host
// files, and sets back the sysctls that changed.
func (e *env) restoreHost() {
	t := e.t
	if e.link != "" {
		if out, err := exec.Command("ip", "link", "del", e.link).CombinedOutput(); err != nil {
			t.Errorf("teardown: ip link del %s: %v %s", e.link, err, out)
		}
	}
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
			t.Errorf("teardown: the host has a kube-proxy table %s (deleted now)", family)
			if out, err := exec.Command("nft", "delete", "table", family, "kube-proxy").CombinedOutput(); err != nil {
				t.Errorf("teardown: nft delete table %s kube-proxy: %v %s", family, err, out)
			}
		}
	}
	e.host.Restore(t, e.work.Dir)
}
