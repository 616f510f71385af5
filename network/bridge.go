package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ensureBridge creates the bridge if needed and returns it; configureBridge
// gives it its gateways.
func (n *Network) ensureBridge() (netlink.Link, error) {
	name := n.cfg.Bridge
	link, err := netlink.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		attrs.MTU = n.cfg.MTU
		// A MAC set at creation is kept; otherwise the bridge takes the
		// lowest MAC of its ports and changes it as pods come and go,
		// which leaves stale gateway entries in the pods' ARP caches.
		// Derived from the gateway, it also survives a re-creation.
		attrs.HardwareAddr = derivedMAC(bridgeMACKind, gatewayOf(n.subnets[0]))
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("network: create bridge %s: %w", name, err)
		}
		n.log.Info("created bridge", "bridge", name)
		link, err = netlink.LinkByName(name)
	}
	if err != nil {
		return nil, fmt.Errorf("network: bridge %s: %w", name, err)
	}
	if link.Type() != "bridge" {
		return nil, fmt.Errorf("network: %s exists and is a %s, not a bridge", name, link.Type())
	}
	return link, nil
}

// configureBridge gives the bridge its gateway addresses, takes off those
// of former pod subnets (a changed subnet, subnet6 or pod CIDR), and brings
// it up. It comes after setSysctls: the kernel refuses an IPv6 address on
// a link whose disable_ipv6 is 1, as a new bridge's is on a node whose
// net.ipv6.conf.default.disable_ipv6 is.
func (n *Network) configureBridge(br netlink.Link) error {
	gateways := n.gatewayAddrs()
	for _, addr := range gateways {
		if err := netlink.AddrReplace(br, addr); err != nil {
			return fmt.Errorf("network: address %s on %s: %w", addr.IPNet, n.cfg.Bridge, err)
		}
	}
	if err := n.dropFormerGateways(br, gateways); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("network: bring %s up: %w", n.cfg.Bridge, err)
	}
	return nil
}

// dropFormerGateways takes every address but gateways and the IPv6
// link-local one off the bridge, of either family: the bridge is berth's,
// and any other address is the gateway of a former pod subnet, which would
// keep routing the old subnet to the bridge.
func (n *Network) dropFormerGateways(br netlink.Link, gateways []*netlink.Addr) error {
	addrs, err := netlink.AddrList(br, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("network: addresses of %s: %w", n.cfg.Bridge, err)
	}
	for _, addr := range addrs {
		if addr.IP.IsLinkLocalUnicast() || slices.ContainsFunc(gateways, func(g *netlink.Addr) bool { return g.Equal(addr) }) {
			continue
		}
		if err := netlink.AddrDel(br, &addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("network: remove former gateway %s from %s: %w", addr.IPNet, n.cfg.Bridge, err)
		}
		n.log.Info("removed the gateway of a former pod subnet from the bridge", "bridge", n.cfg.Bridge, "address", addr.IPNet)
	}
	return nil
}

// gatewayAddrs are the bridge's addresses, a gateway in each pod subnet.
// An IPv6 one skips duplicate address detection: it is the subnet's by
// definition, and a pod must not be able to make the node give it up.
func (n *Network) gatewayAddrs() []*netlink.Addr {
	var addrs []*netlink.Addr
	for _, s := range n.subnets {
		addr := &netlink.Addr{IPNet: prefixIPNet(netip.PrefixFrom(gatewayOf(s), s.Bits()))}
		if s.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		addrs = append(addrs, addr)
	}
	return addrs
}

// reattach repairs the leases' host veths: it puts them back on the
// bridge, for when the bridge was deleted and re-created under running
// pods, and sets the sysctls of guardHostVeth on those an older berthd
// made without them.
func reattach(br netlink.Link, leases map[string]*lease) error {
	for _, l := range leases {
		link, err := netlink.LinkByName(l.Veth)
		if err != nil {
			continue // gone with its pod, which Reconcile or Detach handles
		}
		if err := guardHostVeth(l.Veth); err != nil {
			return err
		}
		if link.Attrs().MasterIndex == br.Attrs().Index {
			continue
		}
		if err := netlink.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("network: put %s back on %s: %w", l.Veth, br.Attrs().Name, err)
		}
		if err := netlink.LinkSetHairpin(link, true); err != nil {
			return fmt.Errorf("network: hairpin on %s: %w", l.Veth, err)
		}
	}
	return nil
}

// bridgeVeths lists the veths enslaved to the bridge.
func (n *Network) bridgeVeths() ([]string, error) {
	br, err := netlink.LinkByName(n.cfg.Bridge)
	if err != nil {
		return nil, fmt.Errorf("network: bridge %s: %w", n.cfg.Bridge, err)
	}
	links, err := listLinks()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range links {
		if l.Type() == "veth" && l.Attrs().MasterIndex == br.Attrs().Index {
			names = append(names, l.Attrs().Name)
		}
	}
	return names, nil
}

// listLinks dumps the host's links. A dump that links changed under (other
// pods starting or stopping) comes back marked interrupted: it is repeated.
func listLinks() ([]netlink.Link, error) {
	for range 10 {
		links, err := netlink.LinkList()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			if err != nil {
				return nil, fmt.Errorf("network: list links: %w", err)
			}
			return links, nil
		}
	}
	return nil, fmt.Errorf("network: list links: %w (links kept changing)", netlink.ErrDumpInterrupted)
}

// The second byte of the MACs berth derives from addresses: the bridge's
// and the pods' are told apart, and never equal whatever the subnets were.
const (
	bridgeMACKind = 0x62
	podMACKind    = 0x70
)

// derivedMAC is the MAC berth gives the link holding the address ip (its
// first family's): a locally administered one made of its last 4 bytes (all
// of an IPv4 address), so that an address keeps its MAC (the bridge after a
// re-creation, a pod that gets a freed address) and stale entries in
// neighbours' caches stay right.
func derivedMAC(kind byte, ip netip.Addr) net.HardwareAddr {
	a := ip.As16()
	return net.HardwareAddr{0x02, kind, a[12], a[13], a[14], a[15]}
}

// linkLocal is the IPv6 link-local address the kernel gives a link with
// MAC mac (modified EUI-64, RFC 4291; the pod's eth0 is set to make it so).
func linkLocal(mac net.HardwareAddr) netip.Addr {
	return netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80,
		8: mac[0] ^ 0x02, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe, 13: mac[3], 14: mac[4], 15: mac[5]})
}

// setSysctls turns on forwarding (pods reach beyond the bridge) and
// route_localnet on the bridge (127.0.0.1:hostPort is DNATed to a pod and
// leaves through the bridge with a loopback source before masquerade), and
// turns off router advertisements on the bridge: a pod must not give the
// node IPv6 routes or addresses. On a node without IPv6 the last is moot.
// With an IPv6 pod subnet, the bridge takes IPv6 (whatever the node's
// default) and the node forwards IPv6; note that forwarding makes the
// kernel ignore router advertisements on links whose accept_ra is 1, as on
// every router.
func (n *Network) setSysctls() error {
	all := []sysctl{
		{"net/ipv4/ip_forward", "1"},
		{"net/ipv4/conf/" + n.cfg.Bridge + "/route_localnet", "1"},
		{"net/ipv6/conf/" + n.cfg.Bridge + "/accept_ra", "0"},
	}
	if n.hasIPv6() {
		all = append(all, sysctl{"net/ipv6/conf/" + n.cfg.Bridge + "/disable_ipv6", "0"},
			sysctl{"net/ipv6/conf/all/forwarding", "1"})
	}
	changed, err := applySysctls(all...)
	for _, s := range changed {
		n.log.Info("set sysctl for the pod network", "sysctl", strings.ReplaceAll(s.key, "/", "."), "value", s.value)
	}
	return err
}

// sysctl is a key under /proc/sys and its value.
type sysctl struct{ key, value string }

// applySysctls writes the values that differ, in the network namespace of
// the calling thread, and returns those it changed. A key under net/ipv6
// on a node without IPv6 is skipped: there is nothing to set.
func applySysctls(all ...sysctl) (changed []sysctl, err error) {
	for _, s := range all {
		p := "/proc/sys/" + s.key
		cur, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) && strings.HasPrefix(s.key, "net/ipv6/") {
			continue
		}
		if err == nil && strings.TrimSpace(string(cur)) == s.value {
			continue
		}
		if err == nil {
			err = os.WriteFile(p, []byte(s.value), 0o644)
		}
		if err != nil {
			return changed, fmt.Errorf("network: sysctl: %w", err)
		}
		changed = append(changed, s)
	}
	return changed, nil
}
