package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// podIfName is the pod's end of its veth.
const podIfName = "eth0"

// vethPrefix starts the name of every host veth of a pod.
const vethPrefix = "bv"

// vethName derives the host end's name from the pod ID, so Detach and
// Reconcile find it without the lease. IFNAMSIZ allows 15 bytes.
func vethName(podID string) string {
	sum := sha256.Sum256([]byte(podID))
	return vethPrefix + hex.EncodeToString(sum[:6])
}

// addVeth creates the pair with its pod end directly in the pod's
// namespace (named eth0, so nothing is renamed or moved later), puts the
// host end on the bridge, adds the pod's guard chain and host ports, then
// configures the pod end from inside.
func (n *Network) addVeth(l *lease, netnsPath string) error {
	podNS, err := ns.GetNS(netnsPath) // fails unless it is a network namespace
	if err != nil {
		return fmt.Errorf("network: pod network namespace: %w", err)
	}
	defer podNS.Close()
	br, err := netlink.LinkByName(n.cfg.Bridge)
	if err != nil {
		err = fmt.Errorf("network: bridge %s: %w", n.cfg.Bridge, err)
		n.markBroken(err) // the next Attach runs Setup again
		return err
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = l.Veth
	attrs.MTU = n.cfg.MTU
	attrs.MasterIndex = br.Attrs().Index
	// Down until guardHostVeth has set it up to take nothing for itself.
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: podIfName, PeerNamespace: netlink.NsFd(podNS.Fd()),
		PeerHardwareAddr: net.HardwareAddr(l.MAC)}
	err = netlink.LinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		// A leftover of this pod (same name) from a crash; if eth0 is
		// what exists in the pod, the retry fails the same way.
		if derr := delVeth(l.Veth); derr != nil {
			return derr
		}
		err = netlink.LinkAdd(veth)
	}
	if err != nil {
		return fmt.Errorf("network: create veth %s (%s in %s): %w", l.Veth, podIfName, netnsPath, err)
	}
	// The guard hooks the host veth, so it can come no sooner, and no
	// later: once eth0 is up the pod (the kernel itself, with its address
	// probes) can send.
	if err := n.addElements(l); err != nil {
		return err
	}
	// Hairpin lets a pod's packet DNATed back to itself (its own host
	// port) leave through the port it came in on.
	if err := netlink.LinkSetHairpin(veth, true); err != nil {
		return fmt.Errorf("network: hairpin on %s: %w", l.Veth, err)
	}
	if err := guardHostVeth(l.Veth); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("network: bring %s up: %w", l.Veth, err)
	}
	var addrs []podAddr
	for _, ip := range l.addrs() {
		subnet, ok := n.subnetOf(ip)
		if !ok {
			return fmt.Errorf("network: pod %s's address %s is in none of the pod subnets %v", l.Pod, ip, n.subnets)
		}
		addrs = append(addrs, podAddr{netip.PrefixFrom(ip, subnet.Bits()), gatewayOf(subnet)})
	}
	ipv6 := n.hasIPv6()
	return podNS.Do(func(ns.NetNS) error { return configurePodEnd(addrs, ipv6) })
}

// podAddr is one of a pod's addresses, with its subnet's length, and the
// gateway of its family's default route.
type podAddr struct {
	addr    netip.Prefix
	gateway netip.Addr
}

// configurePodEnd runs in the pod's namespace. The pod takes no router
// advertisement: its routes are the ones set here, whatever another pod
// announces (the bridge drops RAs from pods too; this holds if it did not).
// With IPv6 (ipv6: the node's pods get an IPv6 address, hasIPv6), its
// link-local address is made of its MAC (the guard lets it send from that
// one), whatever the node's default; the addresses skip duplicate address
// detection: they are the pod's by its lease, and the guard keeps other
// pods from answering for them.
func configurePodEnd(addrs []podAddr, ipv6 bool) error {
	link, err := netlink.LinkByName(podIfName)
	if err != nil {
		return fmt.Errorf("network: %s in pod: %w", podIfName, err)
	}
	settings := []sysctl{{"net/ipv6/conf/default/accept_ra", "0"}, {"net/ipv6/conf/" + podIfName + "/accept_ra", "0"}}
	if ipv6 {
		settings = append(settings, sysctl{"net/ipv6/conf/" + podIfName + "/disable_ipv6", "0"},
			sysctl{"net/ipv6/conf/" + podIfName + "/addr_gen_mode", "0"})
	}
	if _, err := applySysctls(settings...); err != nil {
		return fmt.Errorf("in pod: %w", err)
	}
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: prefixIPNet(a.addr)}
		if a.addr.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("network: address %s on %s: %w", a.addr, podIfName, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("network: bring %s up: %w", podIfName, err)
	}
	for _, a := range addrs {
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.IP(a.gateway.AsSlice())}
		if err := netlink.RouteAdd(route); err != nil {
			return fmt.Errorf("network: default route via %s: %w", a.gateway, err)
		}
	}
	// podns brings lo up; a namespace made elsewhere may not have.
	if lo, err := netlink.LinkByName("lo"); err == nil && lo.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("network: bring lo up: %w", err)
		}
	}
	return nil
}

// guardHostVeth makes the host end of a pod's veth, a bridge port, take
// nothing for itself. The bridge hands it the frames a pod sends to the
// link-local groups, and the guard chain drops those; should one get past,
// the veth has no IPv6 (no router advertisement, autoconfiguration or
// address; the bridge still forwards the pods' IPv6, and holds the IPv6
// gateway, so the veth never needs IPv6 of its own) and drops IPv4 in
// strict reverse-path filtering, since the route back to a pod is the
// bridge's. A node-wide net.ipv4.conf.all.rp_filter=2 makes it loose.
// accept_ra=0 first keeps it so should IPv6 be turned on by hand.
func guardHostVeth(name string) error {
	_, err := applySysctls(sysctl{"net/ipv6/conf/" + name + "/accept_ra", "0"}, sysctl{"net/ipv6/conf/" + name + "/disable_ipv6", "1"},
		sysctl{"net/ipv4/conf/" + name + "/rp_filter", "1"})
	return err
}

// delVeth deletes a host veth (its peer goes with it); a missing one is
// fine.
func delVeth(name string) error {
	link, err := netlink.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err == nil {
		err = netlink.LinkDel(link)
	}
	if err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("network: delete veth %s: %w", name, err)
	}
	return nil
}
