package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestParsePodCIDR(t *testing.T) {
	for in, want := range map[string]string{
		"10.244.1.0/24":              "[10.244.1.0/24]",
		"fd00:1::/64, 10.244.2.0/24": "[fd00:1::/64 10.244.2.0/24]", // the kubelet's order: the pod IP is IPv6
		"10.244.2.0/24,fd00:1::/64":  "[10.244.2.0/24 fd00:1::/64]",
		"fd00::/64":                  "[fd00::/64]",
	} {
		if p, err := ParsePodCIDR(in); err != nil || fmt.Sprint(p) != want {
			t.Errorf("ParsePodCIDR(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
	for _, in := range []string{"", "10.244.1.1/24", "10.244.1.0/31", "fd00::1/64", "fd00::/127", "10.1.0.0/16,10.2.0.0/16", "fd00::/64,fd01::/64", "::ffff:10.0.0.0/120", "ten"} {
		if _, err := ParsePodCIDR(in); !errors.Is(err, ErrBadPodCIDR) {
			t.Errorf("ParsePodCIDR(%q) = %v, want ErrBadPodCIDR", in, err)
		}
	}
}

// The kubelet's pod CIDR becomes the subnet of the pods attached after it,
// and of the next start; it waits while pods hold addresses in the old one,
// and a configured subnet is never replaced.
func TestSetPodCIDR(t *testing.T) {
	e := newEnv(t, 24)
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	old := e.subnets[0]
	// 10.198.x.0/24 beside the test's 10.199.x.0/24: no other test uses it.
	cidr := netip.MustParsePrefix("10.198." + strings.Split(old.Addr().String(), ".")[2] + ".0/24")

	id, _, a := e.attach(t)
	if err := e.SetPodCIDR(cidr.String()); !errors.Is(err, ErrSubnetInUse) {
		t.Fatalf("SetPodCIDR with a pod attached = %v, want ErrSubnetInUse", err)
	}
	if !old.Contains(netip.MustParseAddr(a.IP.String())) {
		t.Fatalf("pod address %s not in %s", a.IP, old)
	}
	if err := e.Detach(bg, PodInfo{ID: id}, ""); err != nil {
		t.Fatal(err)
	}
	if err := e.SetPodCIDR(cidr.String()); err != nil {
		t.Fatalf("SetPodCIDR: %v", err)
	}
	_, _, b := e.attach(t)
	if !cidr.Contains(netip.MustParseAddr(b.IP.String())) || !b.Gateway.Equal(net.IP(cidr.Addr().Next().AsSlice())) {
		t.Errorf("new pod: %s via %s, want an address in %s", b.IP, b.Gateway, cidr)
	}
	br, err := netlink.LinkByName(e.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != (&net.IPNet{IP: b.Gateway, Mask: net.CIDRMask(24, 32)}).String() {
		t.Errorf("bridge addresses %v, want only the new gateway", addrs)
	}

	// A restart keeps it; a configured subnet wins over it.
	n2, err := New(e.cfg, e.log)
	if err != nil || n2.subnets[0] != cidr {
		t.Errorf("after restart: subnet %v, %v; want %s", n2.subnets[0], err, cidr)
	}
	fixed := e.cfg
	fixed.SubnetFixed = true
	n3, err := New(fixed, e.log)
	if err != nil || n3.subnets[0] != old {
		t.Fatalf("configured subnet: %v, %v; want %s", n3.subnets[0], err, old)
	}
	if err := n3.SetPodCIDR("10.197.0.0/24"); err != nil || n3.subnets[0] != old {
		t.Errorf("SetPodCIDR over a configured subnet = %v, subnet %s; want nil and %s kept", err, n3.subnets[0], old)
	}
}

func TestPodInterfaceStats(t *testing.T) {
	e := newEnv(t, 24)
	_, pin, a := e.attach(t)
	if err := ping(pin, gatewayOf(e.subnets[0]).String()); err != nil {
		t.Fatal(err)
	}
	stats, err := PodInterfaceStats(pin)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].Name != "eth0" || stats[0].TxBytes == 0 || stats[0].RxBytes == 0 {
		t.Errorf("stats of %s's interfaces = %+v, want eth0 with traffic", a.IP, stats)
	}
}

// TestOneSubnetCheck: the configured subnets and the kubelet's pod CIDR
// pass the one check (CheckSubnet, which berthd's configuration uses too):
// the same smallest sizes, and no link-local, loopback or multicast range.
func TestOneSubnetCheck(t *testing.T) {
	for s, want := range map[string]string{
		"10.89.0.0/29": "", "fd00:89::/120": "",
		"10.89.0.0/30": "too small", "fd00:89::/121": "too small",
		"169.254.0.0/16": "unicast", "fe80::/64": "unicast", "fe80::/10": "unicast",
		"127.0.0.0/8": "unicast", "::/0": "unicast", "224.0.0.0/4": "unicast", "ff00::/8": "unicast",
		"160.0.0.0/3": "link-local", "fe00::/7": "unicast",
	} {
		p := netip.MustParsePrefix(s)
		cfg := Config{Subnet: "10.90.0.0/16", StateDir: t.TempDir()}
		if p.Addr().Is4() {
			cfg.Subnet = s
		} else {
			cfg.Subnet6 = s
		}
		_, newErr := New(cfg, nil)
		_, podErr := ParsePodCIDR(s)
		for what, err := range map[string]error{"configured subnet": newErr, "pod CIDR": podErr} {
			if want == "" && err != nil {
				t.Errorf("%s %s: %v, want it accepted", what, s, err)
			}
			if want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
				t.Errorf("%s %s: %v, want an error saying %q", what, s, err, want)
			}
		}
	}
}
