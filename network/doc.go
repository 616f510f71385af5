// Package network is berth's built-in pod network: a bridge with the
// gateway address of the pod subnet, a veth pair per pod whose other end is
// the pod's eth0, a host-local IPAM kept in lease files, and nftables rules
// for host ports and egress masquerade. See Network.
package network
