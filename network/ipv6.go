package network

import (
	"net"
	"net/netip"
	"os"

	"github.com/berth-runtime/berth/cri/errkind"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// IPv6 on the built-in network: pods get an IPv6 address only when a pod
// subnet is IPv6 (the kubelet's pod CIDR, or subnet6); on an IPv4-only node
// nothing here applies but one rule: a pod without an IPv6 address sends
// no IPv6 (forbiddenIPv6).
//
// A pod with an IPv6 address gets these rules in its guard chain (after the
// MAC and IPv4 ones, guard.go), for a pod with fd00::2 and MAC
// 02:70:00:00:00:02, whose link-local address is fe80::70:ff:fe00:2:
//
//	ip6 saddr != { fd00::2, fe80::70:ff:fe00:2, :: } drop   # its own addresses only
//	ip6 saddr :: meta l4proto != icmpv6 drop                # :: only for DAD and MLD
//	ip6 daddr ::1 drop                                      # nothing to the node's loopback
//	icmpv6 type nd-neighbor-advert  @th,64,128 != { fd00::2, fe80::70:ff:fe00:2 } drop  # no NA for others' addresses
//	icmpv6 type nd-neighbor-solicit ip6 length != { 24, 32 } drop  # at most one option, and
//	icmpv6 type nd-neighbor-solicit ip6 length 32 @th,192,16 != 0x0101 drop  # it is the source link-layer address
//	icmpv6 type nd-neighbor-solicit ip6 length 32 @th,208,48 != 0x027000000002 drop  # and the pod's MAC
//	(the same three for nd-neighbor-advert with its target link-layer address, type 2)
//	icmpv6 type { nd-router-advert, nd-redirect } drop      # as on every node
//
// so a pod can claim no other pod's or the node's address, in its packets
// or in neighbour discovery, nor point a neighbour cache at another MAC.
//
//	icmpv6 type nd-neighbor-solicit ip6 saddr :: @th,64,128 != { fd00::2, fe80::70:ff:fe00:2 } drop  # DAD only for its own
//
// Duplicate address detection probes with a nonce option (Linux's) are
// dropped by the option rules: nobody needs to hear them, since berth
// hands out every address once, and the pod's own addresses skip DAD; one
// without options may probe only the pod's own addresses.
const (
	ipv6PayloadLen  = 4
	ipv6SourceOff   = 8
	ipv6DestOffset  = 24
	ndTargetOffset  = 8  // in a neighbour solicitation or advertisement
	ndOptionOffset  = 24 // its first option: type, length (in 8 bytes), link-layer address
	ndNoOptionsLen  = 24
	ndOneOptionLen  = 32
	icmpv6RouterAdv = 134
	icmpv6NeighSol  = 135
	icmpv6NeighAdv  = 136
	icmpv6Redirect  = 137
	ndSourceLLAddr  = 1
	ndTargetLLAddr  = 2
)

var ipv6Loopback = netip.IPv6Loopback()

// subnet4 is the IPv4 pod subnet, if pods get IPv4.
func (n *Network) subnet4() (netip.Prefix, bool) { return n.subnetOf4or6(true) }

// subnet6 is the IPv6 pod subnet, if pods get IPv6.
func (n *Network) subnet6() (netip.Prefix, bool) { return n.subnetOf4or6(false) }

// kernelHasIPv6 says whether the kernel has IPv6: not when it was booted
// with ipv6.disable=1 (or without the ipv6 module), which takes
// /proc/sys/net/ipv6 away. A variable: tests stand for such a kernel.
var kernelHasIPv6 = kernelHasIPv6Proc

func kernelHasIPv6Proc() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}

// checkKernelIPv6 refuses an IPv6 pod subnet on a kernel without IPv6: the
// network is not ready and pods fail, with an error naming the cause, as
// containerd with the bridge plugin fails them on its IPv6 sysctl. Pods
// with IPv4 alone would quietly lack the addresses the pod CIDR promises.
func (n *Network) checkKernelIPv6() error {
	s, ok := n.subnet6()
	if !ok || kernelHasIPv6() {
		return nil
	}
	return errkind.Errorf(errkind.FailedPrecondition,
		"network: pod subnet %s is IPv6, but the kernel has no IPv6 (no /proc/sys/net/ipv6: booted with ipv6.disable=1?); enable IPv6, or drop subnet6 or the pod CIDR's IPv6 range", s)
}

// hasIPv6 says whether pods get IPv6 addresses: the one question behind
// every IPv6 setting, table and rule of the node's side.
func (n *Network) hasIPv6() bool {
	_, ok := n.subnet6()
	return ok
}

func (n *Network) subnetOf4or6(v4 bool) (netip.Prefix, bool) {
	for _, s := range n.subnets {
		if s.Addr().Is4() == v4 {
			return s, true
		}
	}
	return netip.Prefix{}, false
}

// addr4 is the pod's IPv4 address, if it has one.
func (l *lease) addr4() (netip.Addr, bool) { return l.addrOf(true) }

// addr6 is the pod's IPv6 address, if it has one.
func (l *lease) addr6() (netip.Addr, bool) { return l.addrOf(false) }

func (l *lease) addrOf(v4 bool) (netip.Addr, bool) {
	for _, ip := range l.addrs() {
		if ip.Is4() == v4 {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// forbiddenIPv6 matches the IPv6 frames the lease's pod may not send. A pod
// with an address gets the rules above. One without (an IPv4-only node)
// sends no IPv6 at all, as an IPv6-only pod sends no IPv4 (guard.go): its
// namespace still has IPv6 link-local up, which nothing on the node
// serves, and a neighbour solicitation or advertisement from another pod's
// link-local address would poison its neighbours' caches. What its kernel
// sends by itself loses nothing: a duplicate address probe that nobody
// answers succeeds, MLD reports serve no IPv6 multicast where pods have no
// IPv6, and it solicits no router (accept_ra is 0, veth.go).
func forbiddenIPv6(l *lease) [][]expr.Any {
	ip6, ok := l.addr6()
	mac := net.HardwareAddr(l.MAC)
	// A lease with an address but no MAC is none berth wrote (it pinned
	// MACs before it gave IPv6): without the MAC there is no link-local
	// address to allow, so it sends no IPv6 either.
	if !ok || mac == nil {
		return [][]expr.Any{ofType(unix.ETH_P_IPV6)}
	}
	var rules [][]expr.Any
	own, ll := ip6.AsSlice(), linkLocal(mac).AsSlice()
	unspecified := netip.IPv6Unspecified().AsSlice()
	rules = append(rules,
		concat(ofType(unix.ETH_P_IPV6), []expr.Any{netHeader(ipv6SourceOff, 16),
			compare(expr.CmpOpNeq, own), compare(expr.CmpOpNeq, ll), compare(expr.CmpOpNeq, unspecified)}),
		concat(ofType(unix.ETH_P_IPV6), []expr.Any{netHeader(ipv6SourceOff, 16), compare(expr.CmpOpEq, unspecified),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r0}, compare(expr.CmpOpNeq, []byte{unix.IPPROTO_ICMPV6})}),
		concat(ofType(unix.ETH_P_IPV6), []expr.Any{netHeader(ipv6DestOffset, 16), compare(expr.CmpOpEq, ipv6Loopback.AsSlice())}),
		concat(icmpv6Type(icmpv6NeighAdv), []expr.Any{transport(ndTargetOffset, 16),
			compare(expr.CmpOpNeq, own), compare(expr.CmpOpNeq, ll)}),
		// A duplicate address probe (an NS from ::) only for its own
		// addresses: one for another's would make that pod's tentative
		// address fail its detection.
		concat(icmpv6Type(icmpv6NeighSol), []expr.Any{netHeader(ipv6SourceOff, 16), compare(expr.CmpOpEq, unspecified),
			transport(ndTargetOffset, 16), compare(expr.CmpOpNeq, own), compare(expr.CmpOpNeq, ll)}),
	)
	for _, nd := range []struct{ typ, option byte }{{icmpv6NeighSol, ndSourceLLAddr}, {icmpv6NeighAdv, ndTargetLLAddr}} {
		oneOption := []expr.Any{netHeader(ipv6PayloadLen, 2), compare(expr.CmpOpEq, proto(ndOneOptionLen))}
		rules = append(rules,
			concat(icmpv6Type(nd.typ), []expr.Any{netHeader(ipv6PayloadLen, 2),
				compare(expr.CmpOpNeq, proto(ndNoOptionsLen)), compare(expr.CmpOpNeq, proto(ndOneOptionLen))}),
			concat(icmpv6Type(nd.typ), oneOption, []expr.Any{transport(ndOptionOffset, 2), compare(expr.CmpOpNeq, []byte{nd.option, 1})}),
			concat(icmpv6Type(nd.typ), oneOption, []expr.Any{transport(ndOptionOffset+2, len(mac)), compare(expr.CmpOpNeq, mac)}),
		)
	}
	for _, typ := range []byte{icmpv6RouterAdv, icmpv6Redirect} {
		rules = append(rules, icmpv6Type(typ))
	}
	return rules
}

// icmpv6Type matches IPv6 frames carrying an ICMPv6 message of type typ.
func icmpv6Type(typ byte) []expr.Any {
	return concat(ofType(unix.ETH_P_IPV6), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r0},
		compare(expr.CmpOpEq, []byte{unix.IPPROTO_ICMPV6}),
		transport(0, 1),
		compare(expr.CmpOpEq, []byte{typ}),
	})
}

// transport loads length bytes of the transport header at offset into r0.
func transport(offset uint32, length int) expr.Any {
	return &expr.Payload{DestRegister: r0, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: uint32(length)}
}
