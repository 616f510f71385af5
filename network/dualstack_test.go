package network

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// withSubnet6 gives a test network an IPv6 subnet of its own beside its
// IPv4 one.
func withSubnet6(c *Config) {
	x, _ := rand.Int(rand.Reader, big.NewInt(1<<16))
	c.Subnet6 = fmt.Sprintf("fd00:199:%x::/64", x)
}

func ping6(pin, ip string) error {
	out, err := exec.Command("nsenter", "--net="+pin, "busybox", "ping", "-6", "-c", "1", "-W", "2", ip).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s: %v: %s", ip, err, out)
	}
	return nil
}

// TestDualStackPods: with an IPv6 subnet, a pod gets an address in each
// family (the IPv4 one first, as the subnets are listed), reaches the other
// pods and the node in both, and is reached from the node in both; the
// addresses survive a restart and come back to the pool at Detach.
func TestDualStackPods(t *testing.T) {
	e := newEnv(t, 24, withSubnet6)
	subnet6 := netip.MustParsePrefix(e.cfg.Subnet6)
	idA, pinA, a := e.attach(t)
	_, pinB, b := e.attach(t)
	for _, att := range []*Attachment{a, b} {
		if att.IP.To4() == nil || len(att.AdditionalIPs) != 1 || !subnet6.Contains(netip.MustParseAddr(att.AdditionalIPs[0].String())) {
			t.Fatalf("attachment %s + %v, want an IPv4 address then one in %s", att.IP, att.AdditionalIPs, subnet6)
		}
	}
	a6, b6 := a.AdditionalIPs[0].String(), b.AdditionalIPs[0].String()
	serve(t, pinA, "A", 8080)
	serve(t, pinB, "B", 8080)
	mustGet(t, pinA, "tcp6", net.JoinHostPort(b6, "8080"), "B from ["+a6+"]")
	mustGet(t, pinA, "udp6", net.JoinHostPort(b6, "8080"), "B from ["+a6+"]")
	mustGet(t, pinB, "tcp4", net.JoinHostPort(a.IP.String(), "8080"), "A from "+b.IP.String())
	mustGet(t, "", "tcp6", net.JoinHostPort(a6, "8080"), "A from ["+gatewayOf(subnet6).String()+"]")
	if err := ping6(pinA, gatewayOf(subnet6).String()); err != nil {
		t.Error(err)
	}
	if err := ping(pinA, gatewayOf(e.subnets[0]).String()); err != nil {
		t.Error(err)
	}
	// The bridge holds both gateways; the host veth takes no IPv6 itself.
	br, err := netlink.LinkByName(e.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := netlink.AddrList(br, netlink.FAMILY_V6)
	if !slices.ContainsFunc(addrs, func(ad netlink.Addr) bool { return ad.IP.Equal(net.IP(gatewayOf(subnet6).AsSlice())) }) {
		t.Errorf("bridge IPv6 addresses %v, want the gateway %s", addrs, gatewayOf(subnet6))
	}
	for key, want := range map[string]string{"net/ipv6/conf/" + a.HostVeth + "/disable_ipv6": "1", "net/ipv6/conf/" + a.HostVeth + "/accept_ra": "0"} {
		if b, err := os.ReadFile("/proc/sys/" + key); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %s", key, b, err, want)
		}
	}
	stats, err := PodInterfaceStats(pinA)
	if err != nil || len(stats) != 1 || stats[0].TxBytes == 0 {
		t.Errorf("stats %+v, %v", stats, err)
	}

	// A restart keeps both addresses; Detach frees both.
	n2, err := New(e.cfg, e.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Setup(); err != nil {
		t.Fatal(err)
	}
	if l, ok := n2.Lookup(idA); !ok || !l.IP.Equal(a.IP) || len(l.AdditionalIPs) != 1 || !l.AdditionalIPs[0].Equal(a.AdditionalIPs[0]) {
		t.Errorf("Lookup after restart = %+v, %v; want %s and %s", l, ok, a.IP, a6)
	}
	mustGet(t, pinB, "tcp6", net.JoinHostPort(a6, "8080"), "A from ["+b6+"]")
	if err := n2.Detach(bg, PodInfo{ID: idA}, ""); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, idA)
	all, err := n2.leases.all()
	if err != nil {
		t.Fatal(err)
	}
	if used := usedAddrs(all); used[netip.MustParseAddr(a.IP.String())] || used[netip.MustParseAddr(a6)] {
		t.Errorf("addresses in use after Detach: %v", used)
	}
}

// TestIPv6OnlyPods: a pod CIDR with only an IPv6 range gives pods only an
// IPv6 address; they reach each other and the node, their host ports are
// IPv6 ones, and a host port on an IPv4 host_ip is refused.
func TestIPv6OnlyPods(t *testing.T) {
	e := newEnv(t, 24)
	x, _ := rand.Int(rand.Reader, big.NewInt(1<<16))
	cidr := fmt.Sprintf("fd00:198:%x::/64", x)
	if err := e.SetPodCIDR(cidr); err != nil {
		t.Fatal(err)
	}
	_, pinA, a := e.attach(t)
	_, pinB, b := e.attach(t)
	if a.IP.To4() != nil || len(a.AdditionalIPs) != 0 || !netip.MustParsePrefix(cidr).Contains(netip.MustParseAddr(a.IP.String())) {
		t.Fatalf("attachment %s + %v, want only an address in %s", a.IP, a.AdditionalIPs, cidr)
	}
	serve(t, pinB, "B", 8080)
	mustGet(t, pinA, "tcp6", net.JoinHostPort(b.IP.String(), "8080"), "B from ["+a.IP.String()+"]")
	if err := ping6(pinA, a.Gateway.String()); err != nil {
		t.Error(err)
	}
	// The bridge keeps no IPv4 gateway of the subnet before.
	br, _ := netlink.LinkByName(e.cfg.Bridge)
	if addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4); len(addrs) != 0 {
		t.Errorf("bridge IPv4 addresses %v, want none", addrs)
	}
	hp := hostPort()
	_, pinC, _ := e.attach(t, PortMapping{ContainerPort: 8080, HostPort: hp})
	serve(t, pinC, "C", 8080)
	mustGet(t, "", "tcp6", net.JoinHostPort(a.Gateway.String(), fmt.Sprint(hp)), "C")
	mustGet(t, pinA, "tcp6", net.JoinHostPort(a.Gateway.String(), fmt.Sprint(hp)), "C from ["+a.Gateway.String()+"]")
	id, pin := e.newPod(t)
	_, err := e.Attach(bg, PodInfo{ID: id}, pin, []PortMapping{{ContainerPort: 80, HostPort: hostPort(), HostIP: "127.0.0.1"}})
	if err == nil || !strings.Contains(err.Error(), "host_ip") {
		t.Errorf("IPv4 host_ip on an IPv6-only network: %v, want an error naming host_ip", err)
	}
	e.assertGone(t, id)
}

// TestIPv6Guard sends hand-made frames from a dual-stack pod's eth0, each
// breaking one IPv6 rule of its guard chain, next to one that breaks none,
// and watches what reaches the bridge: each rule is proved on its own (a
// frame the rule alone stops).
func TestIPv6Guard(t *testing.T) {
	e := newEnv(t, 24, withSubnet6)
	idA, pinA, _ := e.attach(t)
	_, _, b := e.attach(t)
	l, err := e.leases.get(idA)
	if err != nil {
		t.Fatal(err)
	}
	mac := net.HardwareAddr(l.MAC)
	own, _ := l.addr6()
	other := netip.MustParseAddr(b.AdditionalIPs[0].String())
	ll := linkLocal(mac)
	gw6 := gatewayOf(netip.MustParsePrefix(e.cfg.Subnet6))
	br, err := netlink.LinkByName(e.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel made the pod's link-local address the one the guard allows.
	err = podns.DoInNetNS(pinA, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(eth0, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(addrs, func(ad netlink.Addr) bool { return ad.IP.Equal(ll.AsSlice()) }) {
			return fmt.Errorf("pod addresses %v, want the link-local %s", addrs, ll)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	udp := func(src, dst netip.Addr) frame6 {
		return frame6{src: src, dst: dst, next: unix.IPPROTO_UDP, payload: []byte{0x30, 0x39, 0x30, 0x39, 0, 8, 0, 0}}
	}
	nd := func(typ byte, target netip.Addr, options ...[]byte) frame6 {
		p := append([]byte{typ, 0, 0, 0, 0x60, 0, 0, 0}, target.AsSlice()...)
		for _, o := range options {
			p = append(p, o...)
		}
		dst := gw6
		return frame6{src: own, dst: dst, next: unix.IPPROTO_ICMPV6, payload: p}
	}
	// dad is a duplicate address probe: from ::, to the target's
	// solicited-node group, no option.
	dad := func(typ byte, target netip.Addr) frame6 {
		f := nd(typ, target)
		t16 := target.As16()
		f.src, f.dst = netip.IPv6Unspecified(), netip.AddrFrom16([16]byte{0xff, 0x02, 11: 1, 12: 0xff, 13: t16[13], 14: t16[14], 15: t16[15]})
		return f
	}
	llOption := func(typ byte, m net.HardwareAddr) []byte { return append([]byte{typ, 1}, m...) }
	otherMAC := net.HardwareAddr{0x02, 0x70, 0xde, 0xad, 0xbe, 0xef}
	echo := frame6{src: netip.IPv6Unspecified(), dst: gw6, next: unix.IPPROTO_ICMPV6, payload: []byte{128, 0, 0, 0, 0, 1, 0, 1}}

	for _, tc := range []struct {
		name string
		f    frame6
		pass bool
	}{
		{"UDP from its own address", udp(own, gw6), true},
		{"UDP from its link-local address", udp(ll, netip.MustParseAddr("fe80::1")), true},
		{"ICMPv6 from ::", echo, true},
		{"UDP from another pod's address", udp(other, gw6), false},
		{"UDP from another link-local address", udp(netip.MustParseAddr("fe80::1234"), netip.MustParseAddr("fe80::1")), false},
		{"UDP from ::", udp(netip.IPv6Unspecified(), gw6), false},
		{"UDP to ::1", udp(own, netip.IPv6Loopback()), false},
		{"NA for its own address", nd(icmpv6NeighAdv, own), true},
		{"NA for its own address with its MAC", nd(icmpv6NeighAdv, own, llOption(ndTargetLLAddr, mac)), true},
		{"NA for its link-local address", nd(icmpv6NeighAdv, ll), true},
		{"NA for another pod's address", nd(icmpv6NeighAdv, other), false},
		{"NA for the gateway", nd(icmpv6NeighAdv, gw6), false},
		{"NA with another MAC", nd(icmpv6NeighAdv, own, llOption(ndTargetLLAddr, otherMAC)), false},
		{"NA with another option first", nd(icmpv6NeighAdv, own, llOption(14, mac)), false},
		{"NA with two options", nd(icmpv6NeighAdv, own, llOption(14, mac), llOption(ndTargetLLAddr, otherMAC)), false},
		{"NS with its MAC", nd(icmpv6NeighSol, gw6, llOption(ndSourceLLAddr, mac)), true},
		{"NS with another MAC", nd(icmpv6NeighSol, gw6, llOption(ndSourceLLAddr, otherMAC)), false},
		{"NS with another option first", nd(icmpv6NeighSol, gw6, llOption(14, mac)), false},
		{"NS with two options", nd(icmpv6NeighSol, gw6, llOption(14, mac), llOption(ndSourceLLAddr, otherMAC)), false},
		{"DAD probe for its link-local address", dad(icmpv6NeighSol, ll), true},
		{"DAD probe for another pod's address", dad(icmpv6NeighSol, other), false},
		{"DAD probe for another link-local address", dad(icmpv6NeighSol, netip.MustParseAddr("fe80::1234")), false},
		{"RA", nd(icmpv6RouterAdv, own), false},
		{"redirect", nd(icmpv6Redirect, own), false},
	} {
		got := sendFrame(t, pinA, br, mac, tc.f)
		for try := 0; !got && tc.pass && try < 5; try++ { // the new port may still be settling
			got = sendFrame(t, pinA, br, mac, tc.f)
		}
		if got != tc.pass {
			t.Errorf("%s: reached the bridge = %v, want %v", tc.name, got, tc.pass)
		}
	}

}

// frame6 is an IPv6 packet to send as a raw frame.
type frame6 struct {
	src, dst netip.Addr
	next     byte
	payload  []byte
}

// sendFrame sends f from the pod's eth0 (from its MAC, to the bridge's) and
// tells whether it reached the bridge, the node's side of the guard. A
// random flow label tells it apart from all else there.
func sendFrame(t *testing.T, pin string, br netlink.Link, mac net.HardwareAddr, f frame6) bool {
	t.Helper()
	label := make([]byte, 3)
	rand.Read(label)
	label[0] &= 0x0f
	b := slices.Concat(br.Attrs().HardwareAddr, mac, []byte{0x86, 0xdd},
		[]byte{0x60, label[0], label[1], label[2]}, binary.BigEndian.AppendUint16(nil, uint16(len(f.payload))), []byte{f.next, 255},
		f.src.AsSlice(), f.dst.AsSlice(), f.payload)

	capture, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(capture)
	if err := unix.Bind(capture, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: br.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptTimeval(capture, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})

	err = podns.DoInNetNS(pin, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		return unix.Sendto(s, b, 0, &unix.SockaddrLinklayer{Ifindex: eth0.Attrs().Index, Halen: 6, Addr: [8]byte(append(slices.Clone(br.Attrs().HardwareAddr), 0, 0))})
	})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(capture, buf, 0)
		if err != nil {
			continue
		}
		if n >= 18 && bytes.Equal(buf[6:12], mac) && bytes.Equal(buf[14:18], b[14:18]) {
			return true
		}
	}
	return false
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestIPv6OnlyGuardRules: an IPv6-only pod sends no IPv4 or ARP at all,
// an IPv4-only one no IPv6.
func TestIPv6OnlyGuardRules(t *testing.T) {
	l := &lease{IP: netip.MustParseAddr("fd00::2"), MAC: macAddr(derivedMAC(podMACKind, netip.MustParseAddr("fd00::2")))}
	dual := &lease{IP: netip.MustParseAddr("10.0.0.2"), AdditionalIPs: []netip.Addr{netip.MustParseAddr("fd00::2")}, MAC: l.MAC}
	v4 := &lease{IP: netip.MustParseAddr("10.0.0.2"), MAC: l.MAC}
	// IPv6-only: MAC, groups, ethertypes, all IPv4, all ARP, then the IPv6 ones.
	if got, want := len(forbidden(l)), 5+len(forbiddenIPv6(l)); got != want {
		t.Errorf("IPv6-only pod: %d rules, want %d", got, want)
	}
	// An IPv4-only pod: one rule, all IPv6 (TestIPv4OnlyPodSendsNoIPv6).
	if got := len(forbiddenIPv6(v4)); got != 1 {
		t.Errorf("IPv4-only pod: %d IPv6 rules, want 1 (all IPv6)", got)
	}
	if len(forbiddenIPv6(dual)) <= 1 {
		t.Error("dual-stack pod: no IPv6 address rules")
	}

}

// TestDualStackAttachFailureFreesBoth: an Attach that fails after its lease
// (the pod already has an eth0) leaves neither address held.
func TestDualStackAttachFailureFreesBoth(t *testing.T) {
	e := newEnv(t, 24, withSubnet6)
	id, pin := e.newPod(t)
	err := podns.DoInNetNS(pin, func() error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "eth0"
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "x1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Attach(bg, PodInfo{ID: id}, pin, nil); err == nil {
		t.Fatal("Attach into a namespace with an eth0 succeeded")
	}
	e.assertGone(t, id)
	if files := e.leaseFiles(t); len(files) != 0 {
		t.Errorf("lease files left: %v", files)
	}
	all, err := e.leases.all()
	if err != nil || len(usedAddrs(all)) != 0 {
		t.Errorf("addresses held after a failed Attach: %v, %v", usedAddrs(all), err)
	}
}

// TestIPv6HostPorts: on a dual-stack network a host port without host_ip
// is on the node's addresses of both families, reached from the node, from
// another pod and from the pod itself (hairpin, masqueraded to the
// gateway), but not on ::1 (IPv6 cannot route it to a pod); one on an IPv6
// host_ip is on that address only.
func TestIPv6HostPorts(t *testing.T) {
	e := newEnv(t, 24, withSubnet6)
	hp, hpUDP, hpOne := hostPort(), hostPort(), hostPort()
	for hpUDP == hp || hpOne == hp || hpOne == hpUDP {
		hpUDP, hpOne = hostPort(), hostPort()
	}
	idA, pinA, a := e.attach(t, PortMapping{ContainerPort: 8080, HostPort: hp}, PortMapping{Protocol: "udp", ContainerPort: 8080, HostPort: hpUDP})
	serve(t, pinA, "A", 8080)
	gw4, gw6 := a.Gateway.String(), gatewayOf(e.subnets[1]).String()
	idC, pinC, _ := e.attach(t, PortMapping{ContainerPort: 9090, HostPort: hpOne, HostIP: gw6})
	serve(t, pinC, "C", 9090)
	_, pinB, _ := e.attach(t)
	at := func(ip string, p int32) string { return net.JoinHostPort(ip, fmt.Sprint(p)) }

	mustGet(t, "", "tcp6", at(gw6, hp), "A")
	mustGet(t, "", "udp6", at(gw6, hpUDP), "A")
	mustGet(t, "", "tcp4", at(gw4, hp), "A")
	mustGet(t, "", "tcp4", at("127.0.0.1", hp), "A")
	mustGet(t, pinA, "tcp6", at(gw6, hp), "A from ["+gw6+"]")
	mustGet(t, pinB, "tcp6", at(gw6, hp), "A from ["+gw6+"]") // masqueraded, as in IPv4
	if got, err := get("", "tcp6", at("::1", hp)); err == nil {
		t.Errorf("[::1]:%d answered %q; IPv6 loopback is not translated", hp, got)
	}

	mustGet(t, "", "tcp6", at(gw6, hpOne), "C")
	mustGet(t, pinB, "tcp6", at(gw6, hpOne), "C")
	for _, addr := range []string{at(gw4, hpOne), at("127.0.0.1", hpOne)} {
		if got, err := get("", "tcp4", addr); err == nil {
			t.Errorf("host port bound to %s answered on %s: %q", gw6, addr, got)
		}
	}
	if n := e.elementsOf(t, idA); n != 4 {
		t.Errorf("pod A has %d elements, want 4 (2 ports, 2 families)", n)
	}
	if n := e.elementsOf(t, idC); n != 1 {
		t.Errorf("pod C has %d elements, want 1", n)
	}
	if err := e.Detach(bg, PodInfo{ID: idA}, ""); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, idA)
	if got, err := get("", "tcp6", at(gw6, hp)); err == nil {
		t.Errorf("host port of a detached pod answered %q", got)
	}
}

// TestIPv4OnlyHasNoIPv6: without an IPv6 subnet nothing of IPv6 is made:
// no pod or bridge IPv6 address beyond link-local, no ip6 table, and the
// guard's one IPv6 rule drops it all (TestIPv4OnlyPodSendsNoIPv6).
func TestIPv4OnlyHasNoIPv6(t *testing.T) {
	e := newEnv(t, 24)
	id, pin, a := e.attach(t)
	if len(a.AdditionalIPs) != 0 {
		t.Errorf("additional addresses %v on an IPv4-only network", a.AdditionalIPs)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListTableOfFamily(e.cfg.TableName, nftables.TableFamilyIPv6); err == nil {
		t.Error("an ip6 table on an IPv4-only network")
	}
	global := func(l netlink.Link) []netlink.Addr {
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V6)
		return slices.DeleteFunc(addrs, func(ad netlink.Addr) bool { return ad.IP.IsLinkLocalUnicast() })
	}
	br, _ := netlink.LinkByName(e.cfg.Bridge)
	if g := global(br); len(g) != 0 {
		t.Errorf("bridge IPv6 addresses %v", g)
	}
	err = podns.DoInNetNS(pin, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err == nil && len(global(eth0)) != 0 {
			err = fmt.Errorf("pod IPv6 addresses %v", global(eth0))
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
	l, err := e.leases.get(id)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(forbiddenIPv6(l)); got != 1 {
		t.Errorf("%d IPv6 guard rules, want 1 (all IPv6)", got)
	}
}

// TestIPv4OnlyPodSendsNoIPv6: a pod without an IPv6 address sends no IPv6:
// neither a neighbour solicitation from another pod's link-local address
// (which would poison its neighbours' caches) nor from its own, nor its
// kernel's duplicate address probe, nor an echo request; its IPv4 passes.
func TestIPv4OnlyPodSendsNoIPv6(t *testing.T) {
	e := newEnv(t, 24)
	idA, pinA, _ := e.attach(t)
	idB, _, b := e.attach(t)
	mac, macB := e.leaseMAC(t, idA), e.leaseMAC(t, idB)
	ll, llB := linkLocal(mac), linkLocal(macB)
	br, err := netlink.LinkByName(e.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(pinA, b.IP.String()); err != nil {
		t.Fatalf("IPv4 from pod to pod: %v", err)
	}
	// ns is a neighbour solicitation for target, from src, with the pod's
	// own MAC as its source link-layer address.
	ns := func(src, target netip.Addr) frame6 {
		p := append(append([]byte{icmpv6NeighSol, 0, 0, 0, 0, 0, 0, 0}, target.AsSlice()...), ndSourceLLAddr, 1)
		return frame6{src: src, dst: target, next: unix.IPPROTO_ICMPV6, payload: append(p, mac...)}
	}
	for _, tc := range []struct {
		name string
		f    frame6
	}{
		{"NS from another pod's link-local address", ns(llB, ll)},
		{"NS from its own link-local address", ns(ll, llB)},
		{"DAD probe for its link-local address", frame6{src: netip.IPv6Unspecified(), dst: netip.MustParseAddr("ff02::1:ff00:0"), next: unix.IPPROTO_ICMPV6,
			payload: append([]byte{icmpv6NeighSol, 0, 0, 0, 0, 0, 0, 0}, ll.AsSlice()...)}},
		{"echo request from its link-local address", frame6{src: ll, dst: llB, next: unix.IPPROTO_ICMPV6, payload: []byte{128, 0, 0, 0, 0, 1, 0, 1}}},
	} {
		before := e.dropped(t, idA)
		if sendFrame(t, pinA, br, mac, tc.f) {
			t.Errorf("%s reached the bridge", tc.name)
		} else if e.dropped(t, idA) == before {
			t.Errorf("%s did not reach the bridge, but the guard dropped nothing: the test proves nothing", tc.name)
		}
	}
}

// leaseMAC is the MAC pinned in the pod's lease.
func (e *testEnv) leaseMAC(t *testing.T, pod string) net.HardwareAddr {
	t.Helper()
	l, err := e.leases.get(pod)
	if err != nil {
		t.Fatal(err)
	}
	return net.HardwareAddr(l.MAC)
}
