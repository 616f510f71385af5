package integration

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// lldpGroup is the 802.1AB LLDP group address: a bridge learns the source
// of a frame sent to it and passes it up without any netfilter hook.
var lldpGroup = net.HardwareAddr{0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e}

// TestPodCannotSpoofItsMAC has pod p1 send frames with pod p2's MAC as
// their source, once on the bridge's ordinary path and once to the LLDP
// group: the bridge still forwards p2's MAC to p2's port, and a datagram
// from p3 to p2 reaches p2, never p1.
func TestPodCannotSpoofItsMAC(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	bridgeName, subnet := e.network(t)
	bridge, err := netlink.LinkByName(bridgeName)
	if err != nil {
		t.Fatal(err)
	}
	var pods, nets []string
	var veths []netlink.Link
	for _, name := range []string{"mac-spoofer", "mac-victim", "mac-peer"} {
		pod, netns := e.runSleeperPod(t, name)
		pods = append(pods, pod)
		nets = append(nets, netns)
		veths = append(veths, hostVethOf(t, netns))
	}
	spoofer, victim := openPacketSocket(t, nets[0]), openPacketSocket(t, nets[1])
	victimIP := netip.MustParseAddr(e.podIP(t, pods[1]))
	spooferIP := netip.MustParseAddr(e.podIP(t, pods[0]))

	var listener net.PacketConn
	inNetns(t, nets[1], func() { listener, err = net.ListenPacket("udp4", ":0") })
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	victimAddr := &net.UDPAddr{IP: victimIP.AsSlice(), Port: listener.LocalAddr().(*net.UDPAddr).Port}
	// fromPeer sends text from p3 to p2 (p3 resolves p2's MAC with ARP the
	// first time).
	fromPeer := func(text string) {
		inNetns(t, nets[2], func() {
			c, err := net.DialUDP("udp4", nil, victimAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte(text))
		})
	}
	// The control: p3 reaches p2 (and has its MAC from ARP).
	if !eventually(10*time.Second, func() bool {
		fromPeer("control")
		return receivedUDP(listener, "control", 200*time.Millisecond)
	}) {
		t.Fatal("a datagram from p3 did not reach p2: the test proves nothing")
	}

	gateway := netip.MustParsePrefix(subnet.String()).Addr().Next()
	for _, spoof := range []struct {
		name  string
		frame []byte
	}{
		// From p1's own address, which the address guard lets through.
		{"a datagram to the bridge", ethFrame(bridge.Attrs().HardwareAddr, victim.mac, unix.ETH_P_IP, udp4(spooferIP, gateway, 9, "spoof"))},
		{"an LLDP frame", ethFrame(lldpGroup, victim.mac, unix.ETH_P_LLDP, []byte{0x02, 0x07, 0x04, 0, 0, 0, 0, 0, 0, 0, 0})},
	} {
		// p2 sends a frame of its own, so the bridge (re)learns its port
		// whatever an earlier case did.
		victim.send(t, ethFrame(bridge.Attrs().HardwareAddr, victim.mac, unix.ETH_P_IP, udp4(victimIP, gateway, 9, "here")))
		if !eventually(time.Second, func() bool { return fdbPort(t, bridge, victim.mac) == veths[1].Attrs().Index }) {
			t.Fatalf("before %s: the bridge forwards p2's MAC %s to port %d, want p2's %s (%d): the test proves nothing",
				spoof.name, victim.mac, fdbPort(t, bridge, victim.mac), veths[1].Attrs().Name, veths[1].Attrs().Index)
		}
		spoofer.receive(func([]byte) bool { return false }, 50*time.Millisecond) // drain
		spoofer.send(t, spoof.frame)
		if port := fdbPort(t, bridge, victim.mac); port != veths[1].Attrs().Index {
			t.Errorf("after %s from p1 with p2's MAC, the bridge forwards p2's MAC to port %d (p1's %s is %d), want p2's %s (%d)",
				spoof.name, port, veths[0].Attrs().Name, veths[0].Attrs().Index, veths[1].Attrs().Name, veths[1].Attrs().Index)
		}
		text := "after " + spoof.name
		fromPeer(text)
		captured := spoofer.receive(func(f []byte) bool {
			return bytes.Equal(f[:6], victim.mac) && bytes.Contains(f, []byte(text))
		}, time.Second)
		if captured {
			t.Errorf("after %s from p1 with p2's MAC, p1 captured p3's datagram to p2", spoof.name)
		}
		if !receivedUDP(listener, text, time.Second) {
			t.Errorf("after %s from p1 with p2's MAC, p3's datagram did not reach p2", spoof.name)
		}
	}

	for _, pod := range pods {
		e.removePod(t, pod)
	}
	for _, v := range veths {
		if chains := guardChainsOf(t, bridgeName, v.Attrs().Name); len(chains) > 0 {
			t.Errorf("guard chains of the removed pod's veth %s left: %v", v.Attrs().Name, chains)
		}
	}
	e.assertNoLeaks(t)
}

// fdbPort is the index of the bridge port that the bridge's forwarding
// table sends mac to, 0 when it has no entry.
func fdbPort(t *testing.T, bridge netlink.Link, mac net.HardwareAddr) int {
	t.Helper()
	fdb, err := netlink.NeighList(0, unix.AF_BRIDGE)
	for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 10; i++ {
		fdb, err = netlink.NeighList(0, unix.AF_BRIDGE)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range fdb {
		if n.MasterIndex == bridge.Attrs().Index && bytes.Equal(n.HardwareAddr, mac) {
			return n.LinkIndex
		}
	}
	return 0
}
