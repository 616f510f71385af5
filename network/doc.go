// Package network is berth's pod network. PodNetwork is what the sandbox
// manager uses; Network, the built-in one, is a bridge with the gateway
// address of the pod subnet, a veth pair per pod whose other end is the
// pod's eth0, a host-local IPAM kept in lease files, and nftables rules for
// host ports and egress masquerade. Package network/cni is the other
// PodNetwork: the cluster's CNI plugins.
package network
