package cni

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"

	"github.com/berth-runtime/berth/network"
)

// The pod annotations the kubelet's bandwidth shaping reads.
const (
	IngressBandwidthAnnotation = "kubernetes.io/ingress-bandwidth"
	EgressBandwidthAnnotation  = "kubernetes.io/egress-bandwidth"
)

// cniArgs are the CNI_ARGS of every call for pod, as the kubelet's runtimes
// pass them.
func cniArgs(pod network.PodInfo) ([][2]string, error) {
	args := [][2]string{
		{"IgnoreUnknown", "1"},
		{"K8S_POD_NAMESPACE", pod.Namespace},
		{"K8S_POD_NAME", pod.Name},
		{"K8S_POD_INFRA_CONTAINER_ID", pod.ID},
		{"K8S_POD_UID", pod.UID},
	}
	for _, a := range args {
		// CNI_ARGS is "K=V;K=V": these would change its meaning.
		if strings.ContainsAny(a[1], ";=") {
			return nil, fmt.Errorf("%s %q: contains ; or =", a[0], a[1])
		}
	}
	return args, nil
}

// portMapping is one entry of the portMappings capability.
type portMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// bandwidth is the bandwidth capability: rates in bits per second, bursts
// in bits.
type bandwidth struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// capabilityArgs are the runtimeConfig berth offers the plugins: libcni
// passes each only to the plugins that declare the capability. The CRI's
// DNS config is not offered (dns): berth writes the pod's resolv.conf
// itself.
func capabilityArgs(annotations map[string]string, pms []portMapping, podCIDR []string) (map[string]any, error) {
	caps := map[string]any{}
	if len(pms) > 0 {
		caps["portMappings"] = pms
	}
	if len(podCIDR) > 0 {
		caps["ipRanges"] = ipRanges(podCIDR)
	}
	bw, err := podBandwidth(annotations)
	if err != nil {
		return nil, err
	}
	if bw != nil {
		caps["bandwidth"] = bw
	}
	return caps, nil
}

// portMappings keeps the CRI mappings with a host port: the others need
// nothing beyond the pod IP. The protocol is lower-case, as portmap wants.
func portMappings(in []network.PortMapping) ([]portMapping, error) {
	var out []portMapping
	for _, p := range in {
		if p.HostPort <= 0 {
			continue
		}
		proto := strings.ToLower(p.Protocol)
		switch proto {
		case "":
			proto = "tcp"
		case "tcp", "udp", "sctp":
		default:
			return nil, fmt.Errorf("port mapping %d→%d: protocol %q is not tcp, udp or sctp", p.HostPort, p.ContainerPort, p.Protocol)
		}
		if p.HostPort > 65535 || p.ContainerPort <= 0 || p.ContainerPort > 65535 {
			return nil, fmt.Errorf("port mapping %d→%d: ports must be between 1 and 65535", p.HostPort, p.ContainerPort)
		}
		hostIP := p.HostIP
		if hostIP == "0.0.0.0" {
			hostIP = "" // every address, which portmap spells as none
		}
		out = append(out, portMapping{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: proto, HostIP: hostIP})
	}
	return out, nil
}

// podBandwidth reads the pod's bandwidth annotations, as the kubelet
// does: a quantity of bits per second between 1k and 1P. The burst is
// what containerd passes (the largest the bandwidth plugin takes).
func podBandwidth(annotations map[string]string) (*bandwidth, error) {
	var bw bandwidth
	for _, a := range []struct {
		key         string
		rate, burst *uint64
	}{
		{IngressBandwidthAnnotation, &bw.IngressRate, &bw.IngressBurst},
		{EgressBandwidthAnnotation, &bw.EgressRate, &bw.EgressBurst},
	} {
		v, ok := annotations[a.key]
		if !ok {
			continue
		}
		n, err := parseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("annotation %s=%q: %w", a.key, v, err)
		}
		if n < 1000 || n > 1e15 {
			return nil, fmt.Errorf("annotation %s=%q: must be between 1k and 1P (bits per second)", a.key, v)
		}
		*a.rate, *a.burst = n, math.MaxUint32
	}
	if bw == (bandwidth{}) {
		return nil, nil
	}
	return &bw, nil
}

var quantityRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$`)

// parseQuantity reads a Kubernetes quantity such as "10M", "1.5G" or
// "512Ki" as a whole number, rounded up as Kubernetes does.
func parseQuantity(s string) (uint64, error) {
	m := quantityRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("not a quantity such as 10M or 512Ki")
	}
	r, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("not a number")
	}
	mult := map[string]int64{"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
		"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}[m[2]]
	r.Mul(r, new(big.Rat).SetInt64(mult))
	q, rem := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if rem.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsUint64() {
		return 0, fmt.Errorf("too large")
	}
	return q.Uint64(), nil
}

// ipRanges is the node's pod CIDR as the ipRanges capability (host-local
// reads it): one range set per address family.
func ipRanges(podCIDR []string) [][]map[string]string {
	var sets [][]map[string]string
	for _, c := range podCIDR {
		sets = append(sets, []map[string]string{{"subnet": c}})
	}
	return sets
}
