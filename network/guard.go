package network

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The bridge-family table that keeps a pod from steering its neighbours'
// or the node's IPv6 (pods are IPv4-only, but IPv6 link-local is up in
// every namespace), shown as nft prints it:
//
//	table bridge berth {
//		chain pod-ports { type filter hook prerouting priority filter;
//			iifname "bv*" meta protocol ip6 meta l4proto ipv6-icmp icmpv6 type nd-router-advert counter drop
//			iifname "bv*" meta protocol ip6 meta l4proto ipv6-icmp icmpv6 type nd-redirect counter drop
//		}
//	}
//
// Pod ports are matched by the host veth's name prefix (meta ibrname needs
// nft_meta_bridge, which not every kernel has); frames the node sends go
// through the bridge's output hook, not prerouting.
const chainPodPorts = "pod-ports"

// ICMPv6 types a pod must not send: router advertisements (they would give
// the node and other pods routes and addresses) and redirects.
var forbiddenICMPv6 = []byte{134, 137}

func (n *Network) guardTable() *nftables.Table {
	return &nftables.Table{Name: n.cfg.TableName, Family: nftables.TableFamilyBridge}
}

// writeGuard replaces the bridge-family table in one transaction.
func (n *Network) writeGuard() error {
	t := n.guardTable()
	c, err := replaceTable(t)
	if err != nil {
		return err
	}
	ch := c.AddChain(&nftables.Chain{Name: chainPodPorts, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter})
	for _, typ := range forbiddenICMPv6 {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: r0},
			&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte(vethPrefix)}, // a prefix: no NUL
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: r0},                 // the ethertype: nfproto is "bridge" here
			&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte{unix.ETH_P_IPV6 >> 8, unix.ETH_P_IPV6 & 0xff}},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r0},
			&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: r0, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte{typ}},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: write nftables table bridge %s: %w", n.cfg.TableName, err)
	}
	return nil
}
