package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/test/harness"
)

// TestPodCannotSpoofItsIPv6Address: on a dual-stack network, a pod that
// gives its eth0 another IPv6 address (as root with NET_ADMIN in the pod
// could) cannot reach the node from it, and a neighbour advertisement it
// forges for another pod's IPv6 address does not make the node send that
// pod's traffic to it; from its own address both work. (Each IPv6 guard
// rule is proved on its own by network's TestIPv6Guard.)
func TestPodCannotSpoofItsIPv6Address(t *testing.T) {
	t.Parallel()
	bridgeName, subnet := harness.TestNetwork(t)
	subnet6 := testSubnet6(t, subnet)
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("\n[network]\nbridge = %q\nsubnet = %q\nsubnet6 = %q\n", bridgeName, subnet, subnet6))
	cfg := e.podConfig("spoofer6")
	pod := e.runPod(t, cfg)
	defer e.removePod(t, pod)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("c", sleeper...))
	netns := fmt.Sprintf("/proc/%d/ns/net", e.ctrPID(t, ctr))
	victim, _, _ := e.runWebPod(t, "victim6", 0)
	defer e.removePod(t, victim)

	bridge, err := netlink.LinkByName(bridgeName)
	if err != nil {
		t.Fatal(err)
	}
	gateway := subnet6.Addr().Next()
	own := e.podAddrs(t, pod)[1]
	victimIP := e.podAddrs(t, victim)[1]
	fake := netip.MustParseAddr(subnet6.Addr().String() + "ffff") // never leased: leases are handed out from the bottom

	conn, err := net.ListenPacket("udp6", net.JoinHostPort(gateway.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	received := func(from netip.Addr) bool {
		inNetns(t, netns, func() {
			c, err := net.DialUDP("udp6", &net.UDPAddr{IP: from.AsSlice()}, conn.LocalAddr().(*net.UDPAddr))
			if err != nil {
				t.Fatalf("datagram from %s: %v", from, err)
			}
			defer c.Close()
			c.Write([]byte("hello"))
		})
		conn.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 16)
		for {
			_, addr, err := conn.ReadFrom(buf)
			if err != nil {
				return false
			}
			if addr.(*net.UDPAddr).AddrPort().Addr() == from {
				return true
			}
		}
	}
	if !eventually(10*time.Second, func() bool { return received(own) }) {
		t.Fatalf("a datagram from the pod's own address %s did not reach the node", own)
	}
	var eth0 netlink.Link
	inNetns(t, netns, func() {
		if eth0, err = netlink.LinkByName("eth0"); err == nil {
			err = netlink.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: fake.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD})
		}
	})
	if err != nil {
		t.Fatalf("add %s to the pod's eth0: %v", fake, err)
	}
	if received(fake) {
		t.Errorf("a datagram claiming %s, not the pod's address, reached the node", fake)
	}

	// The node learns the victim's MAC (it talks to it), then the spoofer
	// advertises the victim's address as its own, overriding.
	victimMAC := func() net.HardwareAddr {
		neighs, err := netlink.NeighList(bridge.Attrs().Index, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range neighs {
			if n.IP.Equal(victimIP.AsSlice()) && n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 {
				return n.HardwareAddr
			}
		}
		return nil
	}
	httpGet(t, "http://"+net.JoinHostPort(victimIP.String(), "8080")+"/")
	before := victimMAC()
	if before == nil {
		t.Fatalf("the node has no neighbour entry for %s: the check below would prove nothing", victimIP)
	}
	// From the pod's own address and MAC, to the gateway: only the target
	// is forged (without the guard's target rule the node takes it).
	sendNA(t, netns, bridge.Attrs().HardwareAddr, eth0.Attrs().HardwareAddr, own, gateway, victimIP)
	time.Sleep(500 * time.Millisecond)
	if after := victimMAC(); !bytes.Equal(after, before) {
		t.Errorf("a neighbour advertisement from the pod for %s moved it from %s to %s", victimIP, before, after)
	}
}

// sendNA sends, from the pod's eth0, an unsolicited neighbour advertisement
// with the override flag saying that target is at mac, from src to dst.
func sendNA(t *testing.T, netns string, dstMAC, mac net.HardwareAddr, src, dst, target netip.Addr) {
	t.Helper()
	icmp := append([]byte{136, 0, 0, 0, 0x20, 0, 0, 0}, target.AsSlice()...) // override flag
	icmp = append(icmp, 2, 1)                                                // target link-layer address option
	icmp = append(icmp, mac...)
	binary.BigEndian.PutUint16(icmp[2:], icmpv6Checksum(src, dst, icmp))
	frame := append(append(append([]byte{}, dstMAC...), mac...), 0x86, 0xdd)
	frame = append(frame, 0x60, 0, 0, 0)
	frame = binary.BigEndian.AppendUint16(frame, uint16(len(icmp)))
	frame = append(frame, unix.IPPROTO_ICMPV6, 255)
	frame = append(append(append(frame, src.AsSlice()...), dst.AsSlice()...), icmp...)
	var err error
	inNetns(t, netns, func() {
		var eth0 netlink.Link
		if eth0, err = netlink.LinkByName("eth0"); err != nil {
			return
		}
		var s int
		if s, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0); err != nil {
			return
		}
		defer unix.Close(s)
		addr := &unix.SockaddrLinklayer{Ifindex: eth0.Attrs().Index, Halen: 6}
		copy(addr.Addr[:], dstMAC)
		err = unix.Sendto(s, frame, 0, addr)
	})
	if err != nil {
		t.Fatalf("send a neighbour advertisement for %s: %v", target, err)
	}
}

// icmpv6Checksum is the ICMPv6 checksum of msg (its own checksum field
// zero) from src to dst (RFC 4443, with RFC 8200's pseudo-header).
func icmpv6Checksum(src, dst netip.Addr, msg []byte) uint16 {
	b := append(append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...), binary.BigEndian.AppendUint32(nil, uint32(len(msg)))...)
	b = append(append(b, 0, 0, 0, unix.IPPROTO_ICMPV6), msg...)
	if len(b)%2 == 1 {
		b = append(b, 0)
	}
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// TestIPv4OnlyPodCannotPoisonNeighbours: on an IPv4-only network a pod
// sends no IPv6 (#34). A neighbour solicitation it sends from another
// pod's link-local address, naming its own MAC as that address's, would
// make the pod it asks map the address to it; it never gets there, while
// the same solicitation sent from the node (from addresses of its own)
// does: the control that the pod asked takes such a message. The pod's
// IPv4 reaches the same neighbour.
func TestIPv4OnlyPodCannotPoisonNeighbours(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Fatalf("this kernel has no IPv6, which the test needs (the VM tier has it): %v", err)
	}
	var pods, nets []string
	for _, name := range []string{"poisoner", "impersonated", "asked"} {
		pod, netns := e.runSleeperPod(t, name)
		defer e.removePod(t, pod)
		pods, nets = append(pods, pod), append(nets, netns)
	}
	if addrs := e.podAddrs(t, pods[0]); len(addrs) != 1 || !addrs[0].Is4() {
		t.Fatalf("pod addresses %v on an IPv4-only network, want one IPv4 address", addrs)
	}
	poisoner := openPacketSocket(t, nets[0])
	impersonated, _ := linkLocalOf(t, nets[1])
	asked, askedMAC := linkLocalOf(t, nets[2])
	bridge, _ := e.network(t)
	node := openNodePacketSocket(t, bridge)

	askedIP := e.podIP(t, pods[2])
	var conn net.PacketConn
	var err error
	inNetns(t, nets[2], func() { conn, err = net.ListenPacket("udp4", net.JoinHostPort(askedIP, "0")) })
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if !eventually(10*time.Second, func() bool {
		inNetns(t, nets[0], func() {
			if c, err := net.Dial("udp4", conn.LocalAddr().String()); err == nil {
				c.Write([]byte("over IPv4"))
				c.Close()
			}
		})
		return receivedUDP(conn, "over IPv4", 200*time.Millisecond)
	}) {
		t.Error("a datagram from the pod did not reach its neighbour over IPv4")
	}

	// solicitation asks the asked pod for its link-local address, from
	// src, giving the poisoner's MAC as src's.
	solicitation := func(ethSrc net.HardwareAddr, src netip.Addr) []byte {
		icmp := append([]byte{icmpv6NeighborSolicit, 0, 0, 0, 0, 0, 0, 0}, asked.AsSlice()...)
		icmp = append(append(icmp, 1, 1), poisoner.mac...) // source link-layer address option
		return ethFrame(askedMAC, ethSrc, unix.ETH_P_IPV6, ipv6(src, asked, unix.IPPROTO_ICMPV6, icmp, 2))
	}
	cachedAs := func(ip netip.Addr) (mac net.HardwareAddr) {
		inNetns(t, nets[2], func() {
			var neighs []netlink.Neigh
			if neighs, err = netlink.NeighList(0, netlink.FAMILY_V6); err != nil {
				return
			}
			for _, n := range neighs {
				if n.IP.Equal(ip.AsSlice()) {
					mac = n.HardwareAddr
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return mac
	}
	// Each round the poisoner's solicitation goes first; the second round
	// comes once the asked pod takes solicitations (its link-local address
	// may be tentative at first).
	for i, control := range []netip.Addr{netip.MustParseAddr("fe80::c0:1"), netip.MustParseAddr("fe80::c0:2")} {
		if !eventually(15*time.Second, func() bool {
			poisoner.send(t, solicitation(poisoner.mac, impersonated))
			node.send(t, solicitation(node.mac, control))
			return bytes.Equal(cachedAs(control), poisoner.mac)
		}) {
			t.Fatalf("round %d: a neighbour solicitation from the node, saying %s is at %s, did not reach the asked pod's neighbour cache: the test proves nothing", i+1, control, poisoner.mac)
		}
	}
	if mac := cachedAs(impersonated); bytes.Equal(mac, poisoner.mac) {
		t.Errorf("a neighbour solicitation from a pod, from another pod's link-local address %s, made a third pod map it to the sender's MAC %s", impersonated, mac)
	}
}

// linkLocalOf is the IPv6 link-local address of eth0 in the network
// namespace at netns, and eth0's MAC.
func linkLocalOf(t *testing.T, netns string) (netip.Addr, net.HardwareAddr) {
	t.Helper()
	var eth0 netlink.Link
	var addrs []netlink.Addr
	var err error
	inNetns(t, netns, func() {
		if eth0, err = netlink.LinkByName("eth0"); err == nil {
			addrs, err = netlink.AddrList(eth0, netlink.FAMILY_V6)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
			return ip, eth0.Attrs().HardwareAddr
		}
	}
	t.Fatalf("eth0 in %s has no IPv6 link-local address (addresses %v)", netns, addrs)
	return netip.Addr{}, nil
}
