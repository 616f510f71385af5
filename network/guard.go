package network

import (
	"errors"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The guard keeps a pod from steering its neighbours' or the node's
// traffic: it sends from its own MAC and address only (Ethernet, IPv4 and
// ARP), no frames of other protocols (VLAN-tagged ones included), nothing
// to the node's loopback, nothing to the IEEE link-local groups, and,
// having no IPv6 address, no IPv6 at all, though its namespace still has
// IPv6 link-local up (forbiddenIPv6); a pod with an IPv6 address gets the
// IPv6 rules of ipv6.go instead of the last.
//
// Every frame a pod sends meets its host veth's ingress hook before the
// bridge decides anything, so a netdev-family chain per pod port, hooked
// there, sees all of them: those the bridge forwards or passes up (it
// learns their source MAC after its prerouting hook), and those to the
// link-local groups 01:80:c2:00:00:0X, which the bridge never forwards but
// hands to the veth's own stack after its input hook at most (after none
// at all, and learning their source MAC first, for LLDP's group, and for
// STP's with STP on). Shown as nft prints it (the Ethernet header's
// fields raw in a netdev table; counters left out), with what each line
// means, for a pod with address 10.89.0.2 and so MAC 02:70:0a:59:00:02
// (derivedMAC):
//
//	table netdev berth {
//		chain bv1a2b3c4d5e6f {
//			type filter hook ingress device "bv1a2b3c4d5e6f" priority filter; policy accept;
//			@ll,48,48 != 0x2700a590002 counter drop                         # ether saddr != 02:70:0a:59:00:02
//			@ll,0,48 & 0xfffffffffff0 == 0x180c2000000 counter drop         # ether daddr 01:80:c2:00:00:00/44
//			@ll,96,16 != 0x800 @ll,96,16 != 0x806 @ll,96,16 != 0x86dd counter drop   # ether type not ip, arp, ip6
//			@ll,96,16 0x800 @nh,96,32 != 0xa590002 counter drop             # ip saddr != 10.89.0.2
//			@ll,96,16 0x800 @nh,128,32 & 0xff000000 == 0x7f000000 counter drop   # ip daddr 127.0.0.0/8
//			@ll,96,16 0x806 @nh,112,32 != 0xa590002 counter drop            # arp saddr ip != 10.89.0.2
//			@ll,96,16 0x806 @nh,64,48 != 0x2700a590002 counter drop         # arp saddr ether != 02:70:0a:59:00:02
//			@ll,96,16 0x86dd counter drop                                   # ether type ip6
//		}
//	}
//
// The chains are this berthd's only, one per pod, named after its host
// veth, in a table named like its bridge: a second berthd on the node
// (tests run several) guards its own pods. Like the host port maps, a
// pod's chain is added and deleted with its lease, and Setup and Reconcile
// rewrite the table from the leases. The MAC rules need the MAC in the
// lease: a pod attached by a berthd before them keeps its MAC unpinned
// until it is re-created. The host veth itself takes no IPv6 and filters
// reverse paths strictly (guardHostVeth), should a frame get past the
// chain.
const (
	etherDst  = 0
	etherSrc  = 6
	etherType = 12

	// Offsets in the network header: IPv4's source and destination, and
	// ARP's sender hardware and protocol addresses (after the hardware and
	// protocol types and sizes and the operation).
	ipv4SourceOffset = 12
	ipv4DestOffset   = 16
	arpSenderMAC     = 8
	arpSenderIP      = 14
)

var (
	// The IEEE 802.1D link-local groups: 01:80:c2:00:00:00 to :0f.
	linkLocalGroups = net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0}
	linkLocalMask   = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xf0}
)

func (n *Network) guardTable() *nftables.Table {
	return &nftables.Table{Name: n.cfg.TableName, Family: nftables.TableFamilyNetdev}
}

// guardChain is the chain of the lease's port, hooked on its host veth.
func (n *Network) guardChain(l *lease) *nftables.Chain {
	return &nftables.Chain{Name: l.Veth, Table: n.guardTable(), Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityFilter, Device: l.Veth}
}

// queueGuard queues, on c, the chain of the lease's port. Its host veth
// must exist.
func (n *Network) queueGuard(c *nftables.Conn, l *lease) {
	ch := c.AddChain(n.guardChain(l))
	for _, match := range forbidden(l) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch,
			Exprs: append(match, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})})
	}
}

// forbidden matches the frames the lease's pod may not send. A lease
// written before berth pinned MACs has none: its pod keeps its MAC, free,
// until it is re-created.
func forbidden(l *lease) [][]expr.Any {
	mac := net.HardwareAddr(l.MAC)
	var rules [][]expr.Any
	if mac != nil {
		rules = append(rules, []expr.Any{ether(etherSrc, len(mac)), compare(expr.CmpOpNeq, mac)})
	}
	rules = append(rules,
		[]expr.Any{ether(etherDst, len(linkLocalGroups)),
			&expr.Bitwise{SourceRegister: r0, DestRegister: r0, Len: uint32(len(linkLocalMask)), Mask: linkLocalMask, Xor: make([]byte, len(linkLocalMask))},
			compare(expr.CmpOpEq, linkLocalGroups)},
		[]expr.Any{ether(etherType, 2), compare(expr.CmpOpNeq, proto(unix.ETH_P_IP)), compare(expr.CmpOpNeq, proto(unix.ETH_P_ARP)), compare(expr.CmpOpNeq, proto(unix.ETH_P_IPV6))},
	)
	ip4, ok := l.addr4()
	if !ok { // an IPv6-only pod sends no IPv4 and no ARP at all
		return append(append(rules, ofType(unix.ETH_P_IP), ofType(unix.ETH_P_ARP)), forbiddenIPv6(l)...)
	}
	ip := ip4.AsSlice()
	rules = append(rules,
		concat(ofType(unix.ETH_P_IP), []expr.Any{netHeader(ipv4SourceOffset, len(ip)), compare(expr.CmpOpNeq, ip)}),
		concat(ofType(unix.ETH_P_IP), addrIn(ipv4DestOffset, loopback, expr.CmpOpEq)),
		concat(ofType(unix.ETH_P_ARP), []expr.Any{netHeader(arpSenderIP, len(ip)), compare(expr.CmpOpNeq, ip)}),
	)
	if mac != nil {
		rules = append(rules, concat(ofType(unix.ETH_P_ARP), []expr.Any{netHeader(arpSenderMAC, len(mac)), compare(expr.CmpOpNeq, mac)}))
	}
	return append(rules, forbiddenIPv6(l)...)
}

// ether loads length bytes of the Ethernet header at offset into r0. A
// VLAN tag that the kernel took out of the frame is put back for it, so a
// tagged frame's type is 802.1Q.
func ether(offset uint32, length int) expr.Any {
	return &expr.Payload{DestRegister: r0, Base: expr.PayloadBaseLLHeader, Offset: offset, Len: uint32(length)}
}

// netHeader loads length bytes of the network header at offset into r0.
func netHeader(offset uint32, length int) expr.Any {
	return &expr.Payload{DestRegister: r0, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(length)}
}

func compare(op expr.CmpOp, data []byte) expr.Any { return &expr.Cmp{Op: op, Register: r0, Data: data} }

// ofType matches frames of the ethertype.
func ofType(t uint16) []expr.Any {
	return []expr.Any{ether(etherType, 2), compare(expr.CmpOpEq, proto(t))}
}

func proto(t uint16) []byte { return []byte{byte(t >> 8), byte(t)} }

// writeGuard replaces the guard table, with a chain for each lease whose
// host veth exists, in one transaction. It also deletes the bridge-family
// table of the same name in which berth kept its guard before.
func (n *Network) writeGuard(leases map[string]*lease) error {
	c, err := replaceTable(n.guardTable())
	if err != nil {
		return err
	}
	old := &nftables.Table{Name: n.cfg.TableName, Family: nftables.TableFamilyBridge}
	c.AddTable(old)
	c.DelTable(old)
	for _, l := range leases {
		if !l.IP.IsValid() {
			continue // a damaged lease file: the power loss that damaged it ended its pod
		}
		_, err := netlink.LinkByName(l.Veth)
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			continue // gone with its pod, which Reconcile or Detach handles
		}
		if err != nil {
			return fmt.Errorf("network: host veth %s: %w", l.Veth, err)
		}
		if l.MAC == nil {
			n.log.Warn("pod attached by an older berthd: its MAC is not pinned until it is re-created", "pod", l.Pod, "veth", l.Veth)
		}
		n.queueGuard(c, l)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: write nftables table netdev %s: %w", n.cfg.TableName, err)
	}
	return nil
}

// delGuard deletes the chain of the lease's port. A missing one is fine: a
// kernel before 6.16 deletes a chain with the one device it hooks, and an
// Attach that failed early made none.
func (n *Network) delGuard(l *lease) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelChain(n.guardChain(l))
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network: delete guard chain of pod %s: %w", l.Pod, err)
	}
	return nil
}
