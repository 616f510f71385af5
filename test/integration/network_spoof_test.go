package integration

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
)

// TestPodCannotSpoofItsAddress gives a pod's eth0 a second address (as
// root with NET_ADMIN in the pod could) and connects to the node from
// both: what comes from the pod's own address arrives, what claims the
// other (its SYN, and the ARP that would announce it) is dropped at the
// bridge.
func TestPodCannotSpoofItsAddress(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("spoofer")
	pod := e.runPod(t, cfg)
	defer e.removePod(t, pod)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("c", sleeper...))
	netns := fmt.Sprintf("/proc/%d/ns/net", e.ctrPID(t, ctr))

	_, subnet := e.network(t)
	prefix := netip.MustParsePrefix(subnet.String())
	gateway := prefix.Addr().Next()
	own := netip.MustParseAddr(e.podIP(t, pod))
	fake := lastAddr(prefix) // free: leases are handed out from the bottom

	listener, err := net.Listen("tcp4", net.JoinHostPort(gateway.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	accepted := make(chan netip.Addr, 4)
	go func() {
		for {
			c, err := listener.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			c.Close()
		}
	}()
	// received connects from the pod's namespace with from as the source.
	received := func(from netip.Addr) bool {
		inNetns(t, netns, func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}, Timeout: 2 * time.Second}
			c, err := d.Dial("tcp4", listener.Addr().String())
			if err != nil {
				t.Logf("connect from %s: %v", from, err)
				return
			}
			c.Close()
		})
		select {
		case got := <-accepted:
			return got == from
		case <-time.After(time.Second):
			return false
		}
	}
	// The pod's own address first: it also resolves the gateway, so that
	// the spoofed connection is not held back for an ARP the bridge drops.
	// Retried: the pod's link may still be settling on the bridge.
	if !eventually(10*time.Second, func() bool { return received(own) }) {
		t.Fatalf("a connection from the pod's own address %s did not reach the node", own)
	}
	inNetns(t, netns, func() {
		eth0, err := netlink.LinkByName("eth0")
		if err == nil {
			err = netlink.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: fake.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		}
		if err != nil {
			t.Fatalf("add %s to the pod's eth0: %v", fake, err)
		}
	})
	if eventually(3*time.Second, func() bool { return received(fake) }) {
		t.Errorf("a connection claiming %s, not the pod's address, reached the node", fake)
	}
}

// lastAddr is the last address of p below its broadcast address.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 2
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
