package sandbox

import (
	"errors"
	"fmt"
	"net"

	"github.com/berth-runtime/berth/network"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// portMappings converts the CRI's port mappings for the network.
func portMappings(in []*runtimeapi.PortMapping) []network.PortMapping {
	out := make([]network.PortMapping, 0, len(in))
	for _, p := range in {
		out = append(out, network.PortMapping{Protocol: p.Protocol.String(), ContainerPort: p.ContainerPort,
			HostPort: p.HostPort, HostIP: p.HostIp})
	}
	return out
}

// podInfo is what the network is told about the pod.
func podInfo(pod *store.Pod) network.PodInfo {
	md := pod.Config.GetMetadata()
	return network.PodInfo{ID: pod.ID, Name: md.GetName(), Namespace: md.GetNamespace(), UID: md.GetUid(),
		Annotations: pod.Config.GetAnnotations()}
}

// hasPodNetwork reports whether the pod was given a network namespace, and
// so may hold an attachment to release (also when it got no IP).
func hasPodNetwork(pod *store.Pod) bool {
	return pod.IP != "" || pod.Pins[string(podns.Net)] != ""
}

func ipStrings(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

func podIPs(pod *store.Pod) []string {
	if pod.IP == "" {
		return nil
	}
	return append([]string{pod.IP}, pod.AdditionalIPs...)
}

// networkError names the field a network failure came from; the network
// chose its kind.
func networkError(err error) error {
	if errors.Is(err, network.ErrPortInUse) {
		return fmt.Errorf("port_mappings: %w", err)
	}
	return fmt.Errorf("pod network: %w", err)
}

// SetPodCIDR hands the kubelet's pod CIDR to the pod network. An empty CIDR
// changes nothing (the CRI says to omit it).
func (m *Manager) SetPodCIDR(cidr string) error {
	if cidr == "" {
		return nil
	}
	if err := m.opts.Network.SetPodCIDR(cidr); err != nil {
		return fmt.Errorf("runtime_config.network_config.pod_cidr: %w", err)
	}
	return nil
}
