package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The nftables table (family ip) that berth owns, shown as nft prints it:
//
//	table ip berth {
//		map hostports    { type inet_proto . inet_service : ipv4_addr . inet_service }
//		map hostip-ports { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
//		chain prerouting  { type nat hook prerouting priority dstnat; jump hostports }
//		chain output      { type nat hook output priority -100; jump hostports }
//		chain hostports {
//			dnat ip to ip daddr . meta l4proto . th dport map @hostip-ports
//			fib daddr type local dnat ip to meta l4proto . th dport map @hostports
//		}
//		chain postrouting { type nat hook postrouting priority srcnat;
//			oifname "berth0" ct status dnat ip saddr 127.0.0.0/8 masquerade   # node → 127.0.0.1:hostPort
//			oifname "berth0" ct status dnat ip saddr 10.89.0.0/16 masquerade  # pod → hostPort, hairpin
//			ip saddr 10.89.0.0/16 ip daddr != 10.89.0.0/16 ip daddr != 224.0.0.0/4 masquerade  # if Masquerade
//		}
//		chain input { type filter hook input priority filter;
//			iifname "berth0" ip daddr 127.0.0.0/8 ct status ! dnat drop  # see below
//		}
//	}
//
// With an IPv6 pod subnet, table ip6 berth has the same maps (of IPv6
// addresses), chains and hairpin masquerade, the egress masquerade of the
// IPv6 subnet (ff00::/8 left alone), and neither the 127.0.0.0/8 rules nor
// an equivalent: IPv6 has no route_localnet, so [::1]:hostPort is not
// translated (`ip6 daddr != ::1` before the fib rule) and a pod's packets to
// ::1 are dropped by its guard. A mapping without host_ip gets an element
// in each family's map the pod has an address in.
//
// A host port is one map element (commented with the pod ID), so Attach and
// Detach add and delete elements in one transaction and never touch rules,
// and a lookup costs the same for 1 or 1000 mappings. The lease files are
// the record: Setup rewrites the whole table from them atomically, and
// Reconcile rewrites the maps.
//
// route_localnet on the bridge would let a pod reach the node's loopback
// services by sending to 127.0.0.1 via the gateway; the input rule drops
// that, letting through only replies of DNATed connections.
const (
	mapAnyIP  = "hostports"
	mapOneIP  = "hostip-ports"
	chainHost = "hostports"
)

// ipFamily is what the host port rules of one address family need: its
// table (ip or ip6), the layout of its header and its special ranges.
type ipFamily struct {
	name      string
	table     nftables.TableFamily
	nfproto   byte
	addrType  nftables.SetDatatype
	addrLen   int
	srcOffset uint32
	dstOffset uint32
	multicast netip.Prefix
	loopback  netip.Prefix
	is4       bool
	keyAnyIP  nftables.SetDatatype
	keyOneIP  nftables.SetDatatype
	valDest   nftables.SetDatatype
	addrRegs  uint32 // 32-bit registers an address takes
}

var (
	ipv4 = newIPFamily("ip", nftables.TableFamilyIPv4, unix.NFPROTO_IPV4, nftables.TypeIPAddr, 4, ipv4SourceOffset, ipv4DestOffset, multicast, loopback)
	ipv6 = newIPFamily("ip6", nftables.TableFamilyIPv6, unix.NFPROTO_IPV6, nftables.TypeIP6Addr, 16, ipv6SourceOff, ipv6DestOffset,
		netip.MustParsePrefix("ff00::/8"), netip.PrefixFrom(netip.IPv6Loopback(), 128))
)

func newIPFamily(name string, table nftables.TableFamily, nfproto byte, addrType nftables.SetDatatype, addrLen int, src, dst uint32, mcast, lo netip.Prefix) ipFamily {
	return ipFamily{name: name, table: table, nfproto: nfproto, addrType: addrType, addrLen: addrLen, srcOffset: src, dstOffset: dst,
		multicast: mcast, loopback: lo, is4: addrLen == 4,
		keyAnyIP: nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService),
		keyOneIP: nftables.MustConcatSetType(addrType, nftables.TypeInetProto, nftables.TypeInetService),
		valDest:  nftables.MustConcatSetType(addrType, nftables.TypeInetService),
		addrRegs: uint32(addrLen / 4)}
}

var protoNums = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

// Registers: concatenations take one 32-bit register per field.
const (
	r0 = unix.NFT_REG32_00

	ipsDstNAT = 1 << 5 // IPS_DST_NAT in the conntrack status
)

var (
	loopback  = netip.MustParsePrefix("127.0.0.0/8")
	multicast = netip.MustParsePrefix("224.0.0.0/4")
)

// normalizePorts checks the mappings and keeps those with a host port,
// with lower-case protocols and "" for every address; duplicates collapse.
func normalizePorts(in []PortMapping) ([]PortMapping, error) {
	var out []PortMapping
	seen := map[string]PortMapping{}
	for _, p := range in {
		if p.HostPort == 0 {
			continue
		}
		p.Protocol = strings.ToLower(p.Protocol)
		if p.Protocol == "" {
			p.Protocol = "tcp"
		}
		if _, ok := protoNums[p.Protocol]; !ok {
			return nil, fmt.Errorf("network: port mapping %d: unknown protocol %q", p.HostPort, p.Protocol)
		}
		if p.HostPort < 1 || p.HostPort > 65535 || p.ContainerPort < 1 || p.ContainerPort > 65535 {
			return nil, fmt.Errorf("network: port mapping %d→%d: port out of range", p.HostPort, p.ContainerPort)
		}
		switch p.HostIP {
		case "", "0.0.0.0", "::":
			p.HostIP = ""
		default:
			ip, err := netip.ParseAddr(p.HostIP)
			if err != nil || ip.Zone() != "" {
				return nil, fmt.Errorf("network: port mapping %d: host IP %q is not an IP address", p.HostPort, p.HostIP)
			}
			p.HostIP = ip.Unmap().String()
		}
		k := hostPortName(p)
		if prev, ok := seen[k]; ok {
			if prev != p {
				return nil, fmt.Errorf("network: host port %s is mapped twice", k)
			}
			continue
		}
		seen[k] = p
		out = append(out, p)
	}
	return out, nil
}

func hostPortName(p PortMapping) string {
	if p.HostIP == "" {
		return fmt.Sprintf("%s/%d", p.Protocol, p.HostPort)
	}
	return fmt.Sprintf("%s/%s:%d", p.Protocol, p.HostIP, p.HostPort)
}

// portConflicts fails if another lease holds one of ports. A port on every
// address clashes with the same port on any one address.
func portConflicts(ports []PortMapping, all map[string]*lease) error {
	for _, p := range ports {
		for _, l := range all {
			for _, q := range l.Ports {
				if p.Protocol == q.Protocol && p.HostPort == q.HostPort &&
					(p.HostIP == q.HostIP || p.HostIP == "" || q.HostIP == "") {
					return fmt.Errorf("%w: host port %s is already used by pod %s (%s)", ErrPortInUse, hostPortName(p), l.Pod, hostPortName(q))
				}
			}
		}
	}
	return nil
}

func (n *Network) table(f ipFamily) *nftables.Table {
	return &nftables.Table{Name: n.cfg.TableName, Family: f.table}
}

// portFamilies are the families with a host port table: IPv4 always (its
// table also guards the node's loopback), IPv6 with an IPv6 pod subnet.
func (n *Network) portFamilies() []ipFamily {
	if n.hasIPv6() {
		return []ipFamily{ipv4, ipv6}
	}
	return []ipFamily{ipv4}
}

func (n *Network) portMaps(f ipFamily) (anyIP, oneIP *nftables.Set) {
	t := n.table(f)
	anyIP = &nftables.Set{Table: t, Name: mapAnyIP, IsMap: true, Concatenation: true, KeyType: f.keyAnyIP, DataType: f.valDest}
	oneIP = &nftables.Set{Table: t, Name: mapOneIP, IsMap: true, Concatenation: true, KeyType: f.keyOneIP, DataType: f.valDest}
	return anyIP, oneIP
}

// elements are the map entries of the leases' host ports in family f: a
// mapping on every address goes to the pod's address of each family it
// has, one on a host IP to its family's.
func elements(f ipFamily, leases ...*lease) (anyIP, oneIP []nftables.SetElement) {
	for _, l := range leases {
		comment := l.Pod
		if len(comment) > 200 {
			comment = comment[:200]
		}
		ip, ok := l.addrOf(f.is4)
		if !ok {
			continue
		}
		for _, p := range l.Ports {
			key := append([]byte{protoNums[p.Protocol], 0, 0, 0}, port(p.HostPort)...)
			el := nftables.SetElement{Val: append(ip.AsSlice(), port(p.ContainerPort)...), Comment: comment}
			if p.HostIP == "" {
				el.Key = key
				anyIP = append(anyIP, el)
			} else if hostIP, err := netip.ParseAddr(p.HostIP); err == nil && hostIP.Is4() == f.is4 {
				el.Key = append(hostIP.AsSlice(), key...)
				oneIP = append(oneIP, el)
			}
		}
	}
	return anyIP, oneIP
}

// port is a port in a register: big endian, padded to 4 bytes.
func port(p int32) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }

// replaceTable starts a transaction that replaces t with an empty table:
// adding then deleting it first makes the delete succeed whether or not it
// existed. The caller adds the content and flushes.
func replaceTable(t *nftables.Table) (*nftables.Conn, error) {
	c, err := newBatchConn()
	if err != nil {
		return nil, err
	}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	return c, nil
}

// writeTables replaces the host port table of each family, each in one
// transaction, and deletes an ip6 table left from an IPv6 subnet before.
func (n *Network) writeTables(all map[string]*lease) error {
	var leases []*lease
	for _, l := range all {
		leases = append(leases, l)
	}
	for _, f := range n.portFamilies() {
		if err := n.writeTable(f, leases); err != nil {
			return err
		}
	}
	if !n.hasIPv6() {
		return n.dropIPv6Table()
	}
	return nil
}

// dropIPv6Table deletes the ip6 table an IPv6 subnet before left. It looks
// first: an IPv4-only node's start adds and deletes nothing of IPv6.
func (n *Network) dropIPv6Table() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if _, err := c.ListTableOfFamily(n.cfg.TableName, ipv6.table); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return fmt.Errorf("network: look up nftables table ip6 %s: %w", n.cfg.TableName, err)
	}
	c.DelTable(n.table(ipv6))
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network: delete nftables table ip6 %s: %w", n.cfg.TableName, err)
	}
	return nil
}

// writeTable replaces family f's table in one transaction.
func (n *Network) writeTable(f ipFamily, leases []*lease) error {
	t := n.table(f)
	c, err := replaceTable(t)
	if err != nil {
		return err
	}
	anyEls, oneEls := elements(f, leases...)
	anyIP, oneIP := n.portMaps(f)
	if err := c.AddSet(anyIP, anyEls); err != nil {
		return err
	}
	if err := c.AddSet(oneIP, oneEls); err != nil {
		return err
	}

	// Registers: the address, then the protocol and the port.
	protoReg, portReg := r0+f.addrRegs, r0+f.addrRegs+1
	host := c.AddChain(&nftables.Chain{Name: chainHost, Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: host, Exprs: []expr.Any{
		netHeader(f.dstOffset, f.addrLen),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: protoReg},
		&expr.Payload{DestRegister: portReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, // th dport
		&expr.Lookup{SourceRegister: r0, DestRegister: r0, IsDestRegSet: true, SetName: oneIP.Name, SetID: oneIP.ID},
		dnat(f),
	}})
	var notLoopback []expr.Any
	if !f.is4 {
		// IPv6 has no route_localnet: [::1]:hostPort cannot leave the
		// node, so it is not translated (a listener of the node's own may
		// have it).
		notLoopback = addrIn(f.dstOffset, f.loopback, expr.CmpOpNeq)
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: host, Exprs: concat(notLoopback, []expr.Any{
		&expr.Fib{Register: r0, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: native32(unix.RTN_LOCAL)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r0},
		&expr.Payload{DestRegister: r0 + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: r0, DestRegister: r0, IsDestRegSet: true, SetName: anyIP.Name, SetID: anyIP.ID},
		dnat(f),
	})})

	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"prerouting", nftables.ChainHookPrerouting}, {"output", nftables.ChainHookOutput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: hook.hook, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Verdict{Kind: expr.VerdictJump, Chain: chainHost},
		}})
	}

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	var sources []netip.Prefix
	if f.is4 {
		sources = append(sources, f.loopback)
	}
	subnet, hasSubnet := n.subnet6()
	if f.is4 {
		subnet, hasSubnet = n.subnet4()
	}
	if hasSubnet {
		sources = append(sources, subnet)
	}
	for _, src := range sources {
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: concat(
			ifname(expr.MetaKeyOIFNAME, n.cfg.Bridge),
			ctDNAT(true),
			addrIn(f.srcOffset, src, expr.CmpOpEq),
			[]expr.Any{&expr.Masq{}},
		)})
	}
	if n.cfg.Masquerade && hasSubnet {
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: concat(
			addrIn(f.srcOffset, subnet, expr.CmpOpEq),
			addrIn(f.dstOffset, subnet, expr.CmpOpNeq),
			addrIn(f.dstOffset, f.multicast, expr.CmpOpNeq),
			[]expr.Any{&expr.Masq{}},
		)})
	}

	if f.is4 {
		in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: concat(
			ifname(expr.MetaKeyIIFNAME, n.cfg.Bridge),
			addrIn(f.dstOffset, f.loopback, expr.CmpOpEq),
			ctDNAT(false),
			[]expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}},
		)})
	}

	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: write nftables table %s %s: %w", f.name, n.cfg.TableName, err)
	}
	return nil
}

// dnat translates to the address in r0 and the port after it, as a map
// lookup leaves them.
func dnat(f ipFamily) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.nfproto), RegAddrMin: r0, RegProtoMin: r0 + f.addrRegs, Specified: true}
}

// ctDNAT matches "ct status dnat", or its negation.
func ctDNAT(want bool) []expr.Any {
	op := expr.CmpOpEq
	if want {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Ct{Register: r0, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: r0, DestRegister: r0, Len: 4, Mask: native32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: r0, Data: make([]byte, 4)},
	}
}

// addrIn matches the address at offset (ipv4SourceOffset or
// ipv4DestOffset, ipv6SourceOffset or ipv6DestOffset) against p.
func addrIn(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	addr := p.Addr().AsSlice()
	return []expr.Any{
		netHeader(offset, len(addr)),
		&expr.Bitwise{SourceRegister: r0, DestRegister: r0, Len: uint32(len(addr)), Mask: net.CIDRMask(p.Bits(), len(addr)*8), Xor: make([]byte, len(addr))},
		&expr.Cmp{Op: op, Register: r0, Data: addr},
	}
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{&expr.Meta{Key: key, Register: r0}, &expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: b}}
}

func native32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// addElements adds the lease's host ports and its port's guard chain
// (guard.go) in one transaction: one netlink round trip on the pod start
// path.
func (n *Network) addElements(l *lease) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	for _, f := range n.portFamilies() {
		anyEls, oneEls := elements(f, l)
		anyIP, oneIP := n.portMaps(f)
		if err := setElements(c.SetAddElements, anyIP, anyEls, oneIP, oneEls); err != nil {
			return err
		}
	}
	n.queueGuard(c, l)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: add host ports and guard of pod %s: %w", l.Pod, err)
	}
	return nil
}

// delElements deletes the lease's host ports in one transaction (delGuard
// deletes its guard chain). Some may be gone already (a half-done Attach,
// a table rebuilt without them): the transaction then fails whole, and
// each element is deleted in a transaction of its own, a missing one
// ignored.
func (n *Network) delElements(l *lease) error {
	var all []elementsIn
	for _, f := range n.portFamilies() {
		anyEls, oneEls := elements(f, l)
		anyIP, oneIP := n.portMaps(f)
		all = append(all, elementsIn{anyIP, anyEls}, elementsIn{oneIP, oneEls})
	}
	err := deleteElements(all...)
	if !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return fmt.Errorf("network: delete host ports of pod %s: %w", l.Pod, err)
		}
		return nil
	}
	for _, s := range all {
		for _, el := range s.els {
			if err := deleteElements(elementsIn{s.set, []nftables.SetElement{el}}); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("network: delete host ports of pod %s: %w", l.Pod, err)
			}
		}
	}
	return nil
}

// elementsIn are elements of one set.
type elementsIn struct {
	set *nftables.Set
	els []nftables.SetElement
}

// deleteElements deletes the elements in one transaction.
func deleteElements(all ...elementsIn) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	for _, s := range all {
		if len(s.els) == 0 {
			continue
		}
		if err := c.SetDeleteElements(s.set, s.els); err != nil {
			return err
		}
	}
	return c.Flush()
}

// rewritePorts replaces the maps' contents with the leases' host ports in
// one transaction.
func (n *Network) rewritePorts(live map[string]*lease) error {
	var leases []*lease
	for _, l := range live {
		leases = append(leases, l)
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	for _, f := range n.portFamilies() {
		anyEls, oneEls := elements(f, leases...)
		anyIP, oneIP := n.portMaps(f)
		c.FlushSet(anyIP)
		c.FlushSet(oneIP)
		if err := setElements(c.SetAddElements, anyIP, anyEls, oneIP, oneEls); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: rewrite host port maps: %w", err)
	}
	return nil
}

// setElements queues op (add or delete) for the non-empty element lists.
func setElements(op func(*nftables.Set, []nftables.SetElement) error, anyIP *nftables.Set, anyEls []nftables.SetElement, oneIP *nftables.Set, oneEls []nftables.SetElement) error {
	if len(anyEls) > 0 {
		if err := op(anyIP, anyEls); err != nil {
			return err
		}
	}
	if len(oneEls) > 0 {
		return op(oneIP, oneEls)
	}
	return nil
}
