package network

import (
	"context"
)

// PodInfo names the pod a network operation is for. ID keys everything the
// network keeps about the pod; the rest is what CNI plugins are told
// (K8S_POD_* arguments, annotations for the bandwidth capability).
type PodInfo struct {
	ID          string
	Name        string
	Namespace   string
	UID         string
	Annotations map[string]string
}

// PodNetwork is what the sandbox manager needs of a pod network: the
// built-in bridge (*Network) and the CNI adapter (network/cni) both are one.
// Implementations are safe for concurrent use by different pods; the caller
// never runs two operations on the same pod at once.
type PodNetwork interface {
	// Attach gives the pod whose network namespace is pinned at netnsPath
	// its addresses and host ports. On failure it undoes what it did.
	Attach(ctx context.Context, pod PodInfo, netnsPath string, ports []PortMapping) (*Attachment, error)
	// Detach undoes Attach. It is idempotent, and works when the namespace
	// is gone (after a reboot): what it needs was kept at Attach.
	Detach(ctx context.Context, pod PodInfo, netnsPath string) error
	// Reconcile runs at startup: it keeps the pods in live and releases
	// whatever is attached for any other pod.
	Reconcile(ctx context.Context, live map[string]bool) error
	// Ready is the NetworkReady condition, with the reason when false.
	Ready() (bool, string)
	// SetPodCIDR takes the node's pod CIDR from the kubelet for the pods
	// attached after it; a bad one is ErrBadPodCIDR.
	SetPodCIDR(cidr string) error
}

var _ PodNetwork = (*Network)(nil)
