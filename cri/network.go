package cri

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/store"
)

// podNetworkStatus reports the pod's addresses: the first (IPv4 when it has
// one) as ip, the others as additional_ips.
func podNetworkStatus(pod *store.Pod) *runtimeapi.PodSandboxNetworkStatus {
	st := &runtimeapi.PodSandboxNetworkStatus{Ip: pod.IP}
	for _, ip := range pod.AdditionalIPs {
		st.AdditionalIps = append(st.AdditionalIps, &runtimeapi.PodIP{Ip: ip})
	}
	return st
}
