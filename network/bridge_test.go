package network

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/vishvananda/netlink"
)

// inNode runs f in a network namespace of the test's own, standing for a
// node whose settings the test may change: the host's stay as they are.
// Only what runs on f's thread is in it (Setup, not Attach).
func (e *testEnv) inNode(t *testing.T, f func() error) {
	t.Helper()
	_, pin := e.newPod(t)
	if err := podns.DoInNetNS(pin, f); err != nil {
		t.Fatal(err)
	}
}

// bridgeAddrs are the bridge's addresses of the family, link-local ones
// left out.
func (e *testEnv) bridgeAddrs(t *testing.T, family int) []netip.Prefix {
	t.Helper()
	br, err := netlink.LinkByName(e.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(br, family)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			ip, _ := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// TestIPv6GatewayWithIPv6OffByDefault: on a node whose new links start
// with IPv6 disabled (net.ipv6.conf.default.disable_ipv6=1), a dual-stack
// network still gets ready: the bridge's disable_ipv6=0 is written before
// its IPv6 gateway is added, which the kernel refuses on a link without
// IPv6.
func TestIPv6GatewayWithIPv6OffByDefault(t *testing.T) {
	e := newEnv(t, 24, withSubnet6)
	e.inNode(t, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0o644); err != nil {
			return err
		}
		if err := e.Setup(); err != nil {
			t.Errorf("Setup: %v", err)
		}
		if ok, why := e.Ready(); !ok {
			t.Errorf("not ready: %s", why)
		}
		subnet6 := netip.MustParsePrefix(e.cfg.Subnet6)
		want := []netip.Prefix{netip.PrefixFrom(gatewayOf(subnet6), subnet6.Bits())}
		if got := e.bridgeAddrs(t, netlink.FAMILY_V6); !slices.Equal(got, want) {
			t.Errorf("bridge IPv6 addresses %v, want %v", got, want)
		}
		return nil
	})
}

// TestOldGatewaysGoWhenSubnetsChange: berthd restarted with another subnet
// and subnet6 leaves the bridge with the new gateways only, of both
// families; and back to IPv4 only, with no IPv6 gateway.
func TestOldGatewaysGoWhenSubnetsChange(t *testing.T) {
	e := newEnv(t, 24, withSubnet6)
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	moved := e.cfg
	// 10.198.x.0/24 beside the test's 10.199.x.0/24: no other test uses it.
	moved.Subnet = strings.Replace(moved.Subnet, "10.199.", "10.198.", 1)
	withSubnet6(&moved)
	for _, cfg := range []Config{moved, func() Config { c := moved; c.Subnet6 = ""; return c }()} {
		n, err := New(cfg, e.log)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Setup(); err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			family int
			subnet string
		}{{netlink.FAMILY_V4, cfg.Subnet}, {netlink.FAMILY_V6, cfg.Subnet6}} {
			var want []netip.Prefix
			if f.subnet != "" {
				s := netip.MustParsePrefix(f.subnet)
				want = append(want, netip.PrefixFrom(gatewayOf(s), s.Bits()))
			}
			if got := e.bridgeAddrs(t, f.family); !slices.Equal(got, want) {
				t.Errorf("subnets %s %q: bridge addresses %v, want %v", cfg.Subnet, cfg.Subnet6, got, want)
			}
		}
	}
}

// TestIPv6SubnetWithoutKernelIPv6: on a kernel without IPv6 (booted with
// ipv6.disable=1: kernelHasIPv6 stands for it), an IPv6 pod subnet keeps
// the network unready with a FailedPrecondition error naming the subnet
// and the cause, from Setup, SetPodCIDR and Attach; an IPv4-only network
// is unaffected.
func TestIPv6SubnetWithoutKernelIPv6(t *testing.T) {
	kernelHasIPv6 = func() bool { return false }
	t.Cleanup(func() { kernelHasIPv6 = kernelHasIPv6Proc })
	wantRefusal := func(what string, err error, subnet string) {
		t.Helper()
		if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), subnet) || !strings.Contains(err.Error(), "kernel has no IPv6") {
			t.Errorf("%s: %v, want FailedPrecondition naming %s and the kernel", what, err, subnet)
		}
	}

	e := newEnv(t, 24, withSubnet6)
	wantRefusal("Setup", e.Setup(), e.cfg.Subnet6)
	if ok, why := e.Ready(); ok || !strings.Contains(why, "kernel has no IPv6") {
		t.Errorf("Ready = %v, %q; want not ready, saying why", ok, why)
	}
	id, pin := e.newPod(t)
	_, err := e.Attach(context.Background(), PodInfo{ID: id}, pin, nil)
	wantRefusal("Attach", err, e.cfg.Subnet6)

	v4 := newEnv(t, 24)
	if err := v4.Setup(); err != nil {
		t.Fatalf("IPv4-only Setup: %v", err)
	}
	cidr := v4.cfg.Subnet + ",fd00:198::/64"
	wantRefusal("SetPodCIDR "+cidr, v4.SetPodCIDR(cidr), "fd00:198::/64")
}
