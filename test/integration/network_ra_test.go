package integration

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// ICMPv6 types the test sends from a pod.
const (
	icmpv6EchoRequest     = 128
	icmpv6RouterAdvert    = 134
	icmpv6NeighborSolicit = 135
	icmpv6NeighborAdvert  = 136
	icmpv6Redirect        = 137
)

// TestPodCannotAdvertiseRoutes sends, from inside one pod's network
// namespace on an IPv4-only network, IPv6 router and neighbour
// advertisements, redirects and echo requests to all nodes on the link:
// they leave the pod (its host veth sees them), but a neighbour pod, which
// sees an echo request the node sends (the control), sees none of them (a
// pod without an IPv6 address sends no IPv6 at all); and neither the pods
// nor the bridge accept router advertisements.
func TestPodCannotAdvertiseRoutes(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Fatalf("this kernel has no IPv6, which the test needs (the VM tier has it): %v", err)
	}
	bridge, _ := e.network(t)
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + bridge + "/accept_ra"); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("accept_ra on the bridge %s = %q, %v; want 0", bridge, b, err)
	}

	var nets []string
	var ctrs []string
	for _, name := range []string{"ra-sender", "ra-listener"} {
		cfg := e.podConfig(name)
		pod := e.runPod(t, cfg)
		ctr := e.runContainer(t, pod, cfg, e.ctrConfig("c", sleeper...))
		ctrs = append(ctrs, ctr)
		nets = append(nets, fmt.Sprintf("/proc/%d/ns/net", e.ctrPID(t, ctr)))
		defer e.removePod(t, pod)
	}
	for _, ctr := range ctrs {
		if got := strings.TrimSpace(e.sh(t, ctr, "cat /proc/sys/net/ipv6/conf/eth0/accept_ra /proc/sys/net/ipv6/conf/default/accept_ra")); got != "0\n0" {
			t.Errorf("accept_ra in the pod (eth0, default) = %q, want 0 and 0", got)
		}
	}

	sender, listener := icmpv6Socket(t, nets[0]), icmpv6Socket(t, nets[1])
	senderAddr, _ := linkLocalOf(t, nets[0]) // the source of what it sends to ff02::1
	tap := openNodePacketSocket(t, hostVethOf(t, nets[0]).Attrs().Name)
	node := openNodePacketSocket(t, bridge)
	eth0 := ifIndexIn(t, nets[0], "eth0")
	if err := unix.SetsockoptInt(sender, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptTimeval(listener, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000}); err != nil {
		t.Fatal(err)
	}
	allNodes := &unix.SockaddrInet6{Addr: [16]byte(net.ParseIP("ff02::1").To16()), ZoneId: uint32(eth0)}
	ra := []byte{icmpv6RouterAdvert, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0} // router lifetime 1800 s
	echo := []byte{icmpv6EchoRequest, 0, 0, 0, 0x12, 0x34, 0, 1}
	// Claims fe80::1 (override flag); redirects ff02::1 to it.
	claimed := net.ParseIP("fe80::1").To16()
	na := append([]byte{icmpv6NeighborAdvert, 0, 0, 0, 0x20, 0, 0, 0}, claimed...)
	redirect := append(append([]byte{icmpv6Redirect, 0, 0, 0, 0, 0, 0, 0}, claimed...), allNodes.Addr[:]...)
	forbidden := [][]byte{ra, na, redirect}

	// What the neighbour pod received: ICMPv6 types by source address (the
	// node may send it some too).
	type message struct {
		typ  byte
		from [16]byte
	}
	var seen []message
	recv := func() bool {
		buf := make([]byte, 1500)
		n, from, err := unix.Recvfrom(listener, buf, 0)
		if err != nil {
			return false
		}
		if a, ok := from.(*unix.SockaddrInet6); ok && n > 0 {
			seen = append(seen, message{buf[0], a.Addr})
		}
		return true
	}
	// The control: an echo request the node sends to all nodes.
	nodeAddr := netip.MustParseAddr("fe80::c0:3")
	fromNode := message{icmpv6EchoRequest, nodeAddr.As16()}
	nodeEcho := ethFrame(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, node.mac, unix.ETH_P_IPV6,
		ipv6(nodeAddr, netip.MustParseAddr("ff02::1"), unix.IPPROTO_ICMPV6, slices.Clone(echo), 2))
	// sentEcho tells whether a frame is the sender's echo request.
	sentEcho := func(f []byte) bool {
		return len(f) > 54 && f[12] == 0x86 && f[13] == 0xdd && f[20] == unix.IPPROTO_ICMPV6 &&
			netip.AddrFrom16([16]byte(f[22:38])) == senderAddr && f[54] == icmpv6EchoRequest
	}
	left := false
	deadline := time.Now().Add(15 * time.Second) // the link-local address may still be tentative
	for time.Now().Before(deadline) {
		if left && slices.Contains(seen, fromNode) {
			break
		}
		// Errors are expected while eth0 has no usable source address yet.
		for _, msg := range forbidden {
			_ = unix.Sendto(sender, msg, 0, allNodes)
		}
		_ = unix.Sendto(sender, echo, 0, allNodes)
		node.send(t, nodeEcho)
		left = left || tap.receive(sentEcho, 100*time.Millisecond)
		for recv() {
		}
	}
	if !left {
		t.Fatalf("no echo request from the sender pod (%s) reached its host veth: the test proves nothing", senderAddr)
	}
	if !slices.Contains(seen, fromNode) {
		t.Fatalf("the neighbour pod received no echo request from the node (messages seen: %v): the test proves nothing", seen)
	}
	// Give a late one a moment.
	for range 5 {
		recv()
	}
	for _, msg := range append(forbidden, echo) {
		if slices.Contains(seen, message{msg[0], senderAddr.As16()}) {
			t.Errorf("ICMPv6 type %d from one pod reached another (messages seen: %v)", msg[0], seen)
		}
	}
}

// inNetns runs fn on a thread in the network namespace at path.
func inNetns(t *testing.T, path string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(orig)
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			panic("cannot return to the test's network namespace: " + err.Error())
		}
	}()
	fn()
}

// icmpv6Socket opens a raw ICMPv6 socket in the network namespace at path.
func icmpv6Socket(t *testing.T, path string) int {
	t.Helper()
	var fd int
	var err error
	inNetns(t, path, func() { fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func ifIndexIn(t *testing.T, path, name string) int {
	t.Helper()
	var ifi *net.Interface
	var err error
	inNetns(t, path, func() { ifi, err = net.InterfaceByName(name) })
	if err != nil {
		t.Fatal(err)
	}
	return ifi.Index
}
