// Package network owns the pod network: the built-in bridge and veth setup,
// IPAM, port mappings, DNS and hosts files, and the CNI adapter.
package network
