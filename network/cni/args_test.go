package cni

import (
	"encoding/json"
	"math"
	"net"
	"reflect"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/berth-runtime/berth/network"
)

func TestCNIArgs(t *testing.T) {
	pod := network.PodInfo{ID: "abc123", Name: "web-0", Namespace: "prod", UID: "0b5c-11"}
	got, err := cniArgs(pod)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "prod"}, {"K8S_POD_NAME", "web-0"},
		{"K8S_POD_INFRA_CONTAINER_ID", "abc123"}, {"K8S_POD_UID", "0b5c-11"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("args = %v, want %v", got, want)
	}
	pod.Name = "a;b=c"
	if _, err := cniArgs(pod); err == nil || !strings.Contains(err.Error(), "K8S_POD_NAME") {
		t.Errorf("a name with ; and =: %v", err)
	}
}

func TestPortMappingsCapability(t *testing.T) {
	got, err := portMappings([]network.PortMapping{
		{Protocol: "TCP", ContainerPort: 80, HostPort: 8080},
		{Protocol: "UDP", ContainerPort: 53, HostPort: 5353, HostIP: "127.0.0.1"},
		{Protocol: "SCTP", ContainerPort: 9, HostPort: 9, HostIP: "0.0.0.0"},
		{ContainerPort: 443, HostPort: 8443},
		{Protocol: "TCP", ContainerPort: 9090}, // no host port: nothing to map
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []portMapping{
		{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},
		{HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: "127.0.0.1"},
		{HostPort: 9, ContainerPort: 9, Protocol: "sctp"},
		{HostPort: 8443, ContainerPort: 443, Protocol: "tcp"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	b, _ := json.Marshal(got[1])
	if string(b) != `{"hostPort":5353,"containerPort":53,"protocol":"udp","hostIP":"127.0.0.1"}` {
		t.Errorf("JSON %s", b)
	}
	for _, bad := range []network.PortMapping{
		{Protocol: "ICMP", ContainerPort: 1, HostPort: 1},
		{ContainerPort: 0, HostPort: 80},
		{ContainerPort: 80, HostPort: 70000},
	} {
		if _, err := portMappings([]network.PortMapping{bad}); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestCapabilityArgs(t *testing.T) {
	caps, err := capabilityArgs(nil, nil, nil)
	if err != nil || len(caps) != 0 {
		t.Errorf("no ports, no annotations: %v, %v", caps, err)
	}
	caps, err = capabilityArgs(map[string]string{IngressBandwidthAnnotation: "10M", "other": "x"},
		[]portMapping{{ContainerPort: 80, HostPort: 81, Protocol: "tcp"}}, []string{"10.244.1.0/24", "fd00:1::/64"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(caps)
	want := `{"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295},` +
		`"ipRanges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:1::/64"}]],` +
		`"portMappings":[{"hostPort":81,"containerPort":80,"protocol":"tcp"}]}`
	if string(b) != want {
		t.Errorf("caps %s\nwant %s", b, want)
	}
	if _, err := capabilityArgs(map[string]string{EgressBandwidthAnnotation: "fast"}, nil, nil); err == nil ||
		!strings.Contains(err.Error(), EgressBandwidthAnnotation) {
		t.Errorf("bad annotation: %v", err)
	}
}

func TestPodBandwidth(t *testing.T) {
	bw, err := podBandwidth(map[string]string{IngressBandwidthAnnotation: "1M", EgressBandwidthAnnotation: "2Mi"})
	if err != nil {
		t.Fatal(err)
	}
	if *bw != (bandwidth{IngressRate: 1e6, IngressBurst: math.MaxUint32, EgressRate: 2 << 20, EgressBurst: math.MaxUint32}) {
		t.Errorf("bandwidth %+v", bw)
	}
	for _, v := range []string{"999", "2P", "-1M", "1m"} {
		if _, err := podBandwidth(map[string]string{EgressBandwidthAnnotation: v}); err == nil {
			t.Errorf("%q: no error", v)
		}
	}
	if bw, err := podBandwidth(nil); bw != nil || err != nil {
		t.Errorf("no annotations: %v %v", bw, err)
	}
}

func TestParseQuantity(t *testing.T) {
	for in, want := range map[string]uint64{
		"1000": 1000, "1k": 1000, "10M": 10_000_000, "1.5M": 1_500_000, "1G": 1e9, "1P": 1e15,
		"1Ki": 1024, "512Ki": 512 << 10, "1.5Mi": 3 << 19, "0.0001k": 1, "1Ei": 1 << 60,
	} {
		got, err := parseQuantity(in)
		if err != nil || got != want {
			t.Errorf("parseQuantity(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "1K", "1e3", "1 M", "abc", "100E"} {
		if got, err := parseQuantity(in); err == nil {
			t.Errorf("parseQuantity(%q) = %d, want an error", in, got)
		}
	}
}

func TestAttachmentFromResult(t *testing.T) {
	idx := func(i int) *int { return &i }
	cidr := func(s string) net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return *n
	}
	res := &current.Result{
		CNIVersion: "1.0.0",
		Interfaces: []*current.Interface{{Name: "cni0"}, {Name: "eth0", Sandbox: "/run/netns/x"}},
		IPs: []*current.IPConfig{
			{Address: cidr("10.1.0.1/24"), Interface: idx(0)}, // the bridge's: not the pod's
			{Address: cidr("fd00::5/64"), Interface: idx(1)},
			{Address: cidr("10.1.0.5/24"), Gateway: net.ParseIP("10.1.0.1"), Interface: idx(1)},
			{Address: cidr("10.2.0.5/24")}, // no interface: the pod's
		},
	}
	att, err := attachment(res)
	if err != nil {
		t.Fatal(err)
	}
	if att.IP.String() != "10.1.0.5" || att.Gateway.String() != "10.1.0.1" {
		t.Errorf("ip %s gateway %s", att.IP, att.Gateway)
	}
	var extra []string
	for _, ip := range att.AdditionalIPs {
		extra = append(extra, ip.String())
	}
	if !reflect.DeepEqual(extra, []string{"fd00::5", "10.2.0.5"}) {
		t.Errorf("additional %v", extra)
	}

	v6 := &current.Result{CNIVersion: "1.0.0", IPs: []*current.IPConfig{{Address: cidr("fd00::7/64")}}}
	if att, err := attachment(v6); err != nil || att.IP.String() != "fd00::7" || len(att.AdditionalIPs) != 0 {
		t.Errorf("IPv6 only: %+v %v", att, err)
	}
	if _, err := attachment(&current.Result{CNIVersion: "1.0.0"}); err == nil || !strings.Contains(err.Error(), "no IP") {
		t.Errorf("no IPs: %v", err)
	}
}
