// Package kubeenv is what the two Kubernetes tiers (test/kubelet, a
// standalone kubelet; test/cluster, a one-node cluster) share to run berth
// under a kubelet on this host: daemons started and stopped by PID, a work
// folder, berthd, the kubelet's cgroup root, the host settings a kubelet
// changes, a loopback registry with a busybox image, and waiting helpers.
// Each tier keeps what is its own: the kubelet's flags and configuration,
// the control plane, and the CRI client (its gRPC and cri-api versions
// follow the tier's Kubernetes release).
package kubeenv
