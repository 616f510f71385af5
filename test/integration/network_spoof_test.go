package integration

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
)

// TestPodCannotSpoofItsAddress gives a pod's eth0 a second address (as
// root with NET_ADMIN in the pod could) and checks each source rule of the
// bridge's guard on its own: a datagram from the other address does not
// reach the node (the pod knows the gateway's MAC, so no ARP is needed),
// and an ARP request claiming the other address does not make the node
// learn it as the pod's; the pod's own address passes both ways.
func TestPodCannotSpoofItsAddress(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("spoofer")
	pod := e.runPod(t, cfg)
	defer e.removePod(t, pod)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("c", sleeper...))
	netns := fmt.Sprintf("/proc/%d/ns/net", e.ctrPID(t, ctr))

	bridgeName, subnet := e.network(t)
	bridge, err := netlink.LinkByName(bridgeName)
	if err != nil {
		t.Fatal(err)
	}
	prefix := netip.MustParsePrefix(subnet.String())
	gateway := prefix.Addr().Next()
	own := netip.MustParseAddr(e.podIP(t, pod))
	fake := lastAddr(prefix) // free: leases are handed out from the bottom

	conn, err := net.ListenPacket("udp4", net.JoinHostPort(gateway.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// send sends a datagram from the pod's namespace with from as its source.
	send := func(from netip.Addr) {
		inNetns(t, netns, func() {
			c, err := net.DialUDP("udp4", &net.UDPAddr{IP: from.AsSlice()}, conn.LocalAddr().(*net.UDPAddr))
			if err != nil {
				t.Fatalf("datagram from %s: %v", from, err)
			}
			defer c.Close()
			c.Write([]byte("hello")) // an unresolved neighbour is no error here
		})
	}
	// received tells whether a datagram from from reaches the node's socket.
	received := func(from netip.Addr) bool {
		send(from)
		conn.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 16)
		for {
			_, addr, err := conn.ReadFrom(buf)
			if err != nil {
				return false
			}
			if addr.(*net.UDPAddr).AddrPort().Addr().Unmap() == from {
				return true
			}
		}
	}
	// nodeLearnt tells whether the node has a as a neighbour at mac.
	nodeLearnt := func(a netip.Addr, mac net.HardwareAddr) bool {
		neighs, err := netlink.NeighList(bridge.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range neighs {
			if n.IP.Equal(a.AsSlice()) && bytes.Equal(n.HardwareAddr, mac) && n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 {
				return true
			}
		}
		return false
	}

	// The pod's own address: its datagram arrives, and its ARP for the
	// gateway (sent for that datagram) taught the node where it is.
	// Retried: the pod's link may still be settling on the bridge.
	if !eventually(10*time.Second, func() bool { return received(own) }) {
		t.Fatalf("a datagram from the pod's own address %s did not reach the node", own)
	}
	var eth0 netlink.Link
	inNetns(t, netns, func() { eth0, err = netlink.LinkByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	podMAC := eth0.Attrs().HardwareAddr
	if !eventually(3*time.Second, func() bool { return nodeLearnt(own, podMAC) }) {
		t.Fatalf("the node has no neighbour %s at %s: the ARP check below would prove nothing", own, podMAC)
	}

	gatewayNeigh := &netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: gateway.AsSlice(), HardwareAddr: bridge.Attrs().HardwareAddr}
	inNetns(t, netns, func() {
		err = netlink.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: fake.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		if err == nil {
			err = netlink.NeighSet(gatewayNeigh)
		}
	})
	if err != nil {
		t.Fatalf("add %s to the pod's eth0 and pin its gateway's MAC: %v", fake, err)
	}
	// The IPv4 source rule: no ARP involved, the datagram is dropped.
	if received(fake) {
		t.Errorf("a datagram claiming %s, not the pod's address, reached the node", fake)
	}

	// The ARP sender rule: without the gateway's MAC, a datagram from fake
	// makes the pod ask for it in an ARP request from fake, which the node
	// would answer and learn fake from.
	inNetns(t, netns, func() { err = netlink.NeighDel(gatewayNeigh) })
	if err != nil {
		t.Fatal(err)
	}
	send(fake)
	time.Sleep(1500 * time.Millisecond) // the pod asks again every second
	if nodeLearnt(fake, podMAC) {
		t.Errorf("an ARP request claiming %s taught the node that the pod has it", fake)
	}
}

// lastAddr is the last address of p below its broadcast address.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 2
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
