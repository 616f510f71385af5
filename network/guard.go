package network

import (
	"fmt"
	"maps"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The bridge-family table that keeps a pod from steering its neighbours'
// or the node's traffic: no address but its own (IPv4 and ARP), no frames
// of other protocols, and no IPv6 router advertisements, redirects or
// neighbour advertisements (pods are IPv4-only, but IPv6 link-local is up
// in every namespace). Shown as nft prints it:
//
//	table bridge berth {
//		set pod-veths   { type ifname }               # the host veths of this berthd's pods
//		set pod-sources { type ifname . ipv4_addr }   # host veth . the pod's address
//		chain pod-ports { type filter hook prerouting priority filter;
//			iifname @pod-veths meta protocol != ip meta protocol != arp meta protocol != ip6 counter drop
//			iifname @pod-veths meta protocol ip iifname . ip saddr != @pod-sources counter drop
//			iifname @pod-veths meta protocol arp iifname . arp saddr ip != @pod-sources counter drop
//			iifname "bv*" meta protocol ip6 meta l4proto ipv6-icmp icmpv6 type nd-router-advert counter drop
//			iifname "bv*" meta protocol ip6 meta l4proto ipv6-icmp icmpv6 type nd-neighbor-advert counter drop
//			iifname "bv*" meta protocol ip6 meta l4proto ipv6-icmp icmpv6 type nd-redirect counter drop
//		}
//	}
//
// A bridge-family table sees every bridge of the node (meta ibrname, which
// would tell them apart, needs nft_meta_bridge, which not every kernel
// has). The ICMPv6 rules may match every berth pod port by the host veth's
// name prefix; the source rules match only this berthd's own ports (the
// pod-veths set), or a second berthd on the node (tests run several) would
// drop the other's pods. Frames the node sends go through the bridge's
// output hook, not prerouting. Like the host port maps, a pod's veth and
// source are set elements, added and deleted with its lease and rewritten
// from the leases by Setup and Reconcile.
const (
	chainPodPorts = "pod-ports"
	setVeths      = "pod-veths"
	setSources    = "pod-sources"
)

var keySource = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)

// ICMPv6 types a pod must not send: router advertisements (they would give
// the node and other pods routes and addresses), neighbour advertisements
// (they would claim another's address) and redirects.
var forbiddenICMPv6 = []byte{134, 136, 137}

// Offsets of the sender address in the network header: IPv4's source, and
// ARP's sender protocol address (after the hardware and protocol types and
// sizes, the operation and the sender's hardware address).
const (
	ipv4SourceOffset = 12
	arpSenderOffset  = 14
)

func (n *Network) guardTable() *nftables.Table {
	return &nftables.Table{Name: n.cfg.TableName, Family: nftables.TableFamilyBridge}
}

func (n *Network) vethSet() *nftables.Set {
	return &nftables.Set{Table: n.guardTable(), Name: setVeths, KeyType: nftables.TypeIFName}
}

func (n *Network) sourceSet() *nftables.Set {
	return &nftables.Set{Table: n.guardTable(), Name: setSources, KeyType: keySource, Concatenation: true}
}

// vethElements are the leases' host veths, sourceElements their (host
// veth, address) pairs.
func vethElements(leases ...*lease) []nftables.SetElement {
	els := make([]nftables.SetElement, 0, len(leases))
	for _, l := range leases {
		els = append(els, nftables.SetElement{Key: ifnameKey(l.Veth)})
	}
	return els
}

func sourceElements(leases ...*lease) []nftables.SetElement {
	els := make([]nftables.SetElement, 0, len(leases))
	for _, l := range leases {
		els = append(els, nftables.SetElement{Key: append(ifnameKey(l.Veth), l.IP.AsSlice()...)})
	}
	return els
}

// ifnameKey is an interface name as nftables compares it: IFNAMSIZ bytes.
func ifnameKey(name string) []byte {
	key := make([]byte, unix.IFNAMSIZ, unix.IFNAMSIZ+4)
	copy(key, name)
	return key
}

// writeGuard replaces the bridge-family table, with the sources of the
// leases, in one transaction.
func (n *Network) writeGuard(all map[string]*lease) error {
	t := n.guardTable()
	c, err := replaceTable(t)
	if err != nil {
		return err
	}
	leases := slices.Collect(maps.Values(all))
	veths, set := n.vethSet(), n.sourceSet()
	if err := c.AddSet(veths, vethElements(leases...)); err != nil {
		return err
	}
	if err := c.AddSet(set, sourceElements(leases...)); err != nil {
		return err
	}
	ch := c.AddChain(&nftables.Chain{Name: chainPodPorts, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter})
	anyPod := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: r0},
		&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte(vethPrefix)}, // a prefix: no NUL
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: r0},                 // the ethertype: nfproto is "bridge" here
	}
	ownPod := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: r0},
		&expr.Lookup{SourceRegister: r0, SetName: veths.Name, SetID: veths.ID},
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: r0},
	}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	rule := func(from []expr.Any, match ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(from, match, drop)})
	}
	rule(ownPod, ethertype(expr.CmpOpNeq, unix.ETH_P_IP), ethertype(expr.CmpOpNeq, unix.ETH_P_ARP), ethertype(expr.CmpOpNeq, unix.ETH_P_IPV6))
	for _, sender := range []struct {
		proto  uint16
		offset uint32
	}{{unix.ETH_P_IP, ipv4SourceOffset}, {unix.ETH_P_ARP, arpSenderOffset}} {
		rule(ownPod, ethertype(expr.CmpOpEq, sender.proto),
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: r0}, // r0-r3: IFNAMSIZ bytes
			&expr.Payload{DestRegister: unix.NFT_REG32_04, Base: expr.PayloadBaseNetworkHeader, Offset: sender.offset, Len: 4},
			&expr.Lookup{SourceRegister: r0, SetName: set.Name, SetID: set.ID, Invert: true})
	}
	for _, typ := range forbiddenICMPv6 {
		rule(anyPod, ethertype(expr.CmpOpEq, unix.ETH_P_IPV6),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r0},
			&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: r0, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte{typ}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: write nftables table bridge %s: %w", n.cfg.TableName, err)
	}
	return nil
}

// ethertype compares the frame's ethertype, loaded in r0, with proto.
func ethertype(op expr.CmpOp, proto uint16) expr.Any {
	return &expr.Cmp{Op: op, Register: r0, Data: []byte{byte(proto >> 8), byte(proto)}}
}

// queueSource queues, on c, letting the pod send from its own address.
func (n *Network) queueSource(c *nftables.Conn, l *lease) error {
	if err := c.SetAddElements(n.vethSet(), vethElements(l)); err != nil {
		return err
	}
	return c.SetAddElements(n.sourceSet(), sourceElements(l))
}

// rewriteSources replaces the set's contents with the leases' sources in
// one transaction.
func (n *Network) rewriteSources(leases []*lease) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	veths, set := n.vethSet(), n.sourceSet()
	c.FlushSet(veths)
	c.FlushSet(set)
	if len(leases) > 0 {
		if err := c.SetAddElements(veths, vethElements(leases...)); err != nil {
			return err
		}
		if err := c.SetAddElements(set, sourceElements(leases...)); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: rewrite pod sources: %w", err)
	}
	return nil
}
