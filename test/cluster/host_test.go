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
// a route into the test ranges (IPv4 and IPv6) or a kube-proxy's tables
// (kubeenv.RecordHost refuses one where a kubelet runs).
func checkHost(t *testing.T) {
	t.Helper()
	checkNoRoute(t, "-4", testRange)
	checkNoRoute(t, "-6", testRange6)
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
			t.Fatalf("nftables table %s kube-proxy exists: a kube-proxy runs on this host", family)
		}
	}
}

// checkNoRoute fails t when a route of the host's, in the family of
// ip(8)'s flag (-4 or -6), touches tierRange.
func checkNoRoute(t *testing.T, family, tierRange string) {
	t.Helper()
	out, err := exec.Command("ip", family, "-o", "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s route: %v %s", family, err, out)
	}
	test := netip.MustParsePrefix(tierRange)
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
			t.Fatalf("the host routes %s, inside the tier's range %s: %s", p, tierRange, line)
		}
	}
}

// addNodeLink makes the link that holds the control plane's addresses, to
// which the nodes' veths are joined, and routes the whole test ranges to
// it: an address of the ranges no node, pod or Service holds goes nowhere,
// never out of the host. The IPv6 address skips duplicate address
// detection: a tentative address cannot be bound. The host forwards
// between the nodes (it routes each node's pod CIDRs to it): forwarding on
// in both families, restored at the end.
func (e *env) addNodeLink() {
	t := e.t
	t.Helper()
	link := fmt.Sprintf("bcn%d", os.Getpid()%100000)
	for i, args := range [][]string{
		{"link", "add", link, "type", "bridge"},
		{"addr", "add", hostIP + "/32", "dev", link},
		{"link", "set", link, "up"},
		{"route", "add", testRange, "dev", link},
		{"addr", "add", hostIP6 + "/128", "dev", link, "nodad"},
		{"route", "add", testRange6, "dev", link},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
		}
		if i == 0 {
			e.link = link
		}
	}
	for _, sysctl := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile("/proc/sys/"+sysctl, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
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
