package network

import (
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// InterfaceStats are one interface's cumulative counters, those the CRI
// reports (it has no packet or drop counts).
type InterfaceStats struct {
	Name                                  string
	RxBytes, RxPackets, RxErrors, RxDrops uint64
	TxBytes, TxPackets, TxErrors, TxDrops uint64
}

// PodInterfaceStats reads the counters of every interface but loopback in
// the network namespace pinned at netnsPath, the pod's own (eth0, in both
// the built-in and the CNI mode) first. It asks netlink through a handle
// bound to that namespace, so no thread changes namespace.
func PodInterfaceStats(netnsPath string) ([]InterfaceStats, error) {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("network: pod network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE) // only routing: a kernel may lack the others (xfrm)
	if err != nil {
		return nil, fmt.Errorf("network: netlink in %s: %w", netnsPath, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("network: links in %s: %w", netnsPath, err)
	}
	var out []InterfaceStats
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || a.Statistics == nil {
			continue
		}
		s := a.Statistics
		out = append(out, InterfaceStats{Name: a.Name, RxBytes: s.RxBytes, RxPackets: s.RxPackets, RxErrors: s.RxErrors, RxDrops: s.RxDropped,
			TxBytes: s.TxBytes, TxPackets: s.TxPackets, TxErrors: s.TxErrors, TxDrops: s.TxDropped})
	}
	if i := slices.IndexFunc(out, func(s InterfaceStats) bool { return s.Name == podIfName }); i > 0 {
		out[0], out[i] = out[i], out[0]
	}
	return out, nil
}
