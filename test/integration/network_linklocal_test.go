package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// paeGroup is the IEEE 802.1X group address, one of the link-local groups
// (01:80:c2:00:00:0X) a bridge does not forward: it hands their frames to
// the stack of the port they came in on, the pod's host veth.
var paeGroup = net.HardwareAddr{0x01, 0x80, 0xc2, 0x00, 0x00, 0x03}

// TestPodLinkLocalFramesGuarded sends, from inside a pod's network
// namespace, raw frames to a link-local group address, which the bridge
// passes to the node's stack on the pod's host veth without running its
// prerouting hook: a router advertisement with a prefix gives the node no
// route or address, a datagram from another pod's address does not reach a
// socket on the bridge's address, and one to 127.0.0.1 (with route_localnet
// on the veth, as kube-proxy sets it node-wide) does not reach a listener
// there. The host veth takes no IPv6 and filters reverse paths strictly,
// and its guard goes with the pod.
func TestPodLinkLocalFramesGuarded(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Fatalf("this kernel has no IPv6, which the test needs (the VM tier has it): %v", err)
	}
	pod, netns := e.runSleeperPod(t, "linklocal")
	bridgeName, subnet := e.network(t)
	bridge, err := netlink.LinkByName(bridgeName)
	if err != nil {
		t.Fatal(err)
	}
	veth := hostVethOf(t, netns)
	vethName := veth.Attrs().Name

	sysctl := func(key string) string {
		b, err := os.ReadFile("/proc/sys/" + key)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if v6 := "net/ipv6/conf/" + vethName + "/"; sysctl(v6+"disable_ipv6") != "1" &&
		(sysctl(v6+"accept_ra") != "0" || sysctl(v6+"autoconf") != "0") {
		t.Errorf("host veth %s takes IPv6: disable_ipv6 %s, accept_ra %s, autoconf %s; want disable_ipv6 1 or accept_ra and autoconf 0",
			vethName, sysctl(v6+"disable_ipv6"), sysctl(v6+"accept_ra"), sysctl(v6+"autoconf"))
	}
	if got := sysctl("net/ipv4/conf/" + vethName + "/rp_filter"); got != "1" {
		t.Errorf("rp_filter on host veth %s = %s, want 1 (strict)", vethName, got)
	}

	p := openPacketSocket(t, netns)
	prefix := netip.MustParsePrefix("2001:db8:b0:1::/64")
	raSource := netip.MustParseAddr("fe80::b0:1")
	ra := routerAdvert(raSource, prefix)
	for range 3 {
		p.send(t, ethFrame(paeGroup, p.mac, unix.ETH_P_IPV6, ra))
		time.Sleep(100 * time.Millisecond)
	}
	// What the RA would give the node: a route (default via its source, the
	// prefix's, or any of protocol "ra") or an address in the prefix.
	learnt := func() []string {
		var got []string
		for _, link := range []netlink.Link{veth, bridge} {
			routes, _ := netlink.RouteList(link, netlink.FAMILY_V6)
			for _, r := range routes {
				if r.Protocol == unix.RTPROT_RA || (r.Dst != nil && prefix.Overlaps(ipPrefix(r.Dst))) ||
					(r.Gw != nil && r.Gw.Equal(raSource.AsSlice())) {
					got = append(got, fmt.Sprintf("route %s on %s", r, link.Attrs().Name))
				}
			}
			addrs, _ := netlink.AddrList(link, netlink.FAMILY_V6)
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && prefix.Contains(ip) {
					got = append(got, fmt.Sprintf("address %s on %s", a.IPNet, link.Attrs().Name))
				}
			}
		}
		return got
	}
	eventually(2*time.Second, func() bool { return len(learnt()) > 0 })
	if got := learnt(); len(got) > 0 {
		t.Errorf("a router advertisement from a pod to %s configured the node: %v", paeGroup, got)
	}

	gatewayPrefix := netip.MustParsePrefix(subnet.String())
	gateway := gatewayPrefix.Addr().Next()
	own := netip.MustParseAddr(e.podIP(t, pod))
	other := lastAddr(gatewayPrefix) // no pod's yet; the pods' guard knows only the pod's own
	conn, err := net.ListenPacket("udp4", net.JoinHostPort(gateway.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	port := uint16(conn.LocalAddr().(*net.UDPAddr).Port)
	// The control: a hand-made datagram from the pod's own address, to the
	// bridge's MAC, reaches the socket (retried while the port settles).
	if !eventually(10*time.Second, func() bool {
		p.send(t, ethFrame(bridge.Attrs().HardwareAddr, p.mac, unix.ETH_P_IP, udp4(own, gateway, port, "control")))
		return receivedUDP(conn, "control", 200*time.Millisecond)
	}) {
		t.Fatal("a hand-made datagram from the pod's own address to the bridge's MAC did not reach the node: the test proves nothing")
	}
	for range 3 {
		p.send(t, ethFrame(paeGroup, p.mac, unix.ETH_P_IP, udp4(other, gateway, port, "spoofed")))
	}
	if receivedUDP(conn, "spoofed", time.Second) {
		t.Errorf("a datagram from %s (not the pod's address) sent to %s reached the node's socket on %s", other, paeGroup, gateway)
	}

	// 127.0.0.1: kube-proxy's iptables mode sets route_localnet on every
	// link; here only on the pod's host veth, which goes with the pod.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+vethName+"/route_localnet", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	lo, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	loPort := uint16(lo.LocalAddr().(*net.UDPAddr).Port)
	for range 3 {
		p.send(t, ethFrame(paeGroup, p.mac, unix.ETH_P_IP, udp4(own, netip.MustParseAddr("127.0.0.1"), loPort, "loopback")))
	}
	if receivedUDP(lo, "loopback", time.Second) {
		t.Errorf("a datagram from the pod to 127.0.0.1, sent to %s, reached a listener on the node's loopback", paeGroup)
	}

	e.removePod(t, pod)
	if chains := guardChainsOf(t, bridgeName, vethName); len(chains) > 0 {
		t.Errorf("guard chains of the removed pod's veth %s left: %v", vethName, chains)
	}
	e.assertNoLeaks(t)
}

func ipPrefix(n *net.IPNet) netip.Prefix {
	ip, _ := netip.AddrFromSlice(n.IP)
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), bits)
}

// runSleeperPod runs a pod named name with a container that sleeps, and
// returns the pod's ID and its network namespace as the container's /proc
// entry shows it.
func (e *podEnv) runSleeperPod(t *testing.T, name string) (pod, netns string) {
	t.Helper()
	cfg := e.podConfig(name)
	pod = e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("c", sleeper...))
	return pod, fmt.Sprintf("/proc/%d/ns/net", e.ctrPID(t, ctr))
}

// hostVethOf is the node's end of eth0 in the network namespace at netns.
func hostVethOf(t *testing.T, netns string) netlink.Link {
	t.Helper()
	var eth0 netlink.Link
	var err error
	inNetns(t, netns, func() { eth0, err = netlink.LinkByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	veth, err := netlink.LinkByIndex(eth0.Attrs().ParentIndex)
	if err != nil {
		t.Fatalf("the host end of the pod's eth0 (index %d): %v", eth0.Attrs().ParentIndex, err)
	}
	return veth
}

// guardChainsOf lists the nftables chains of berthd's tables (named after
// its bridge) hooked on veth or named after it.
func guardChainsOf(t *testing.T, table, veth string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, ch := range chains {
		if ch.Table.Name == table && (ch.Name == veth || ch.Device == veth) {
			found = append(found, ch.Name)
		}
	}
	return found
}

// packetSocket sends and receives whole Ethernet frames on a link: a pod's
// eth0, or a link of the node.
type packetSocket struct {
	fd      int
	ifindex int
	mac     net.HardwareAddr // the link's
}

// openPacketSocket opens a raw packet socket on eth0 in the network
// namespace at netns (it stays there), receiving every frame.
func openPacketSocket(t *testing.T, netns string) *packetSocket {
	t.Helper()
	var p *packetSocket
	var err error
	inNetns(t, netns, func() { p, err = packetSocketOn("eth0") })
	if err != nil {
		t.Fatalf("packet socket on eth0 in %s: %v", netns, err)
	}
	t.Cleanup(func() { unix.Close(p.fd) })
	return p
}

// openNodePacketSocket opens one on the link named name in the test's own
// network namespace, the node's. On a pod's host veth it sees the frames
// the pod sends before the pod's guard does; on the bridge it sends as the
// node.
func openNodePacketSocket(t *testing.T, name string) *packetSocket {
	t.Helper()
	p, err := packetSocketOn(name)
	if err != nil {
		t.Fatalf("packet socket on %s: %v", name, err)
	}
	t.Cleanup(func() { unix.Close(p.fd) })
	return p
}

// packetSocketOn opens a raw packet socket, receiving every frame, on the
// link named name in the calling thread's network namespace.
func packetSocketOn(name string) (*packetSocket, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, err
	}
	p := &packetSocket{ifindex: link.Attrs().Index, mac: link.Attrs().HardwareAddr}
	if p.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
		return nil, err
	}
	if err := unix.Bind(p.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: p.ifindex}); err != nil {
		unix.Close(p.fd)
		return nil, err
	}
	return p, nil
}

func (p *packetSocket) send(t *testing.T, frame []byte) {
	t.Helper()
	to := &unix.SockaddrLinklayer{Ifindex: p.ifindex, Halen: 6}
	copy(to.Addr[:], frame[:6])
	if err := unix.Sendto(p.fd, frame, 0, to); err != nil {
		t.Fatalf("send a frame from the pod: %v", err)
	}
}

// receive reports whether a frame for which match is true arrives within d.
func (p *packetSocket) receive(match func(frame []byte) bool, d time.Duration) bool {
	deadline := time.Now().Add(d)
	buf := make([]byte, 2048)
	unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000})
	for time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(p.fd, buf, 0)
		if err == nil && match(buf[:n]) {
			return true
		}
	}
	return false
}

// receivedUDP reports whether a datagram holding text reaches conn within d.
func receivedUDP(conn net.PacketConn, text string, d time.Duration) bool {
	conn.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 1500)
	for {
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			return false
		}
		if string(buf[:n]) == text {
			return true
		}
	}
}

func htons(v uint16) uint16 { return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v)) }

func ethFrame(dst, src net.HardwareAddr, ethertype uint16, payload []byte) []byte {
	f := append(append(bytes.Clone(dst), src...), byte(ethertype>>8), byte(ethertype))
	return append(f, payload...)
}

// udp4 is an IPv4 packet carrying a UDP datagram (without a checksum, which
// IPv4 allows) from port 40000 to port.
func udp4(src, dst netip.Addr, port uint16, text string) []byte {
	udp := binary.BigEndian.AppendUint16(nil, 40000)
	udp = binary.BigEndian.AppendUint16(udp, port)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(text)))
	udp = append(udp, 0, 0)
	udp = append(udp, text...)
	ip := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, unix.IPPROTO_UDP, 0, 0}
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	ip = append(append(ip, src.AsSlice()...), dst.AsSlice()...)
	binary.BigEndian.PutUint16(ip[10:], ^checksum(0, ip))
	return append(ip, udp...)
}

// routerAdvert is an IPv6 packet from src to all nodes carrying a router
// advertisement (router lifetime 600 s) with prefix as on-link and for
// address autoconfiguration.
func routerAdvert(src netip.Addr, prefix netip.Prefix) []byte {
	icmp := []byte{icmpv6RouterAdvert, 0, 0, 0, 64, 0, 0x02, 0x58, 0, 0, 0, 0, 0, 0, 0, 0}
	pio := []byte{3, 4, byte(prefix.Bits()), 0xc0, 0, 0, 0x02, 0x58, 0, 0, 0x01, 0x2c, 0, 0, 0, 0}
	icmp = append(append(icmp, pio...), prefix.Addr().AsSlice()...)
	return ipv6(src, netip.MustParseAddr("ff02::1"), unix.IPPROTO_ICMPV6, icmp, 2)
}

// ipv6 is an IPv6 packet (hop limit 255, as neighbour discovery wants) with
// the upper-layer checksum filled in at csumAt of payload.
func ipv6(src, dst netip.Addr, next byte, payload []byte, csumAt int) []byte {
	hdr := []byte{0x60, 0, 0, 0, 0, 0, next, 255}
	binary.BigEndian.PutUint16(hdr[4:], uint16(len(payload)))
	hdr = append(append(hdr, src.AsSlice()...), dst.AsSlice()...)
	pseudo := append(append(src.AsSlice(), dst.AsSlice()...), 0, 0, byte(len(payload)>>8), byte(len(payload)), 0, 0, 0, next)
	binary.BigEndian.PutUint16(payload[csumAt:], ^checksum(checksum(0, pseudo), payload))
	return append(hdr, payload...)
}

// checksum adds b to the ones' complement sum.
func checksum(sum uint16, b []byte) uint16 {
	s := uint32(sum)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
