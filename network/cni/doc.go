// Package cni runs pods on a network the cluster brings: the standard CNI
// plugins named by the first network configuration in a folder, through
// libcni. Network is a network.PodNetwork, like the built-in bridge.
//
// What DEL needs (the configuration ADD used, the arguments and
// capabilities) is kept in a small file per pod, written before ADD and
// removed after a successful DEL, so that stopping a pod always calls DEL,
// also after a reboot took its network namespace away, and so that an ADD
// that failed half-way can be undone. libcni's own cache (results, for
// CHECK and DEL's prevResult) lives in the cache folder.
package cni
