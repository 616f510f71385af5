package sandbox

import (
	"errors"
	"fmt"

	"github.com/berth-runtime/berth/network"
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

func podIPs(pod *Pod) []string {
	if pod.IP == "" {
		return nil
	}
	return []string{pod.IP}
}

// networkError sorts a network failure into the kind the CRI caller can act
// on: a host port in use is a conflict, a full subnet is exhaustion.
func networkError(err error) error {
	switch {
	case errors.Is(err, network.ErrPortInUse):
		return fmt.Errorf("%w: port_mappings: %v", ErrAlreadyExists, err)
	case errors.Is(err, network.ErrNoAddress):
		return fmt.Errorf("%w: %v", ErrResourceExhausted, err)
	}
	return fmt.Errorf("pod network: %w", err)
}
