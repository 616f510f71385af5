package podfiles

import (
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestHostsContent(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		ips        []string
		tail, err  string
	}{
		{name: "no IPs yet", host: "pod-a"},
		{name: "dual stack", host: "pod-a", ips: []string{"10.88.0.5", "fd00::0005"}, tail: "10.88.0.5\tpod-a\nfd00::5\tpod-a\n"},
		{name: "bad IP", host: "pod-a", ips: []string{"10.88.0.300"}, err: `"10.88.0.300"`},
		{name: "empty host", host: "", err: "hostname"},
		{name: "newline in host", host: "a\n1.2.3.4 evil", err: "hostname"},
	} {
		got, err := hostsContent(tc.host, tc.ips)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || string(got) != hostsHeader+tc.tail {
			t.Errorf("%s: got %q, %v", tc.name, got, err)
		}
	}
	for _, line := range []string{"127.0.0.1\tlocalhost\n", "::1\tlocalhost ip6-localhost ip6-loopback\n",
		"fe00::0\tip6-localnet\n", "fe00::0\tip6-mcastprefix\n", "fe00::1\tip6-allnodes\n", "fe00::2\tip6-allrouters\n"} {
		if !strings.Contains(hostsHeader, line) {
			t.Errorf("hosts lacks %q", line)
		}
	}
}

func TestResolvContent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dns       *runtimeapi.DNSConfig
		want, err string
	}{
		{name: "empty", dns: &runtimeapi.DNSConfig{}, want: ""},
		{
			name: "cluster first",
			dns: &runtimeapi.DNSConfig{
				Servers:  []string{"10.96.0.10", "fd00::a"},
				Searches: []string{"default.svc.cluster.local", "svc.cluster.local", "cluster.local"},
				Options:  []string{"ndots:5", "edns0"},
			},
			want: "search default.svc.cluster.local svc.cluster.local cluster.local\n" +
				"nameserver 10.96.0.10\nnameserver fd00::a\noptions ndots:5 edns0\n",
		},
		{name: "servers only", dns: &runtimeapi.DNSConfig{Servers: []string{"1.1.1.1"}}, want: "nameserver 1.1.1.1\n"},
		{name: "bad server", dns: &runtimeapi.DNSConfig{Servers: []string{"1.1.1.1", "dns.example"}}, err: `DNS server "dns.example"`},
		{name: "space in search", dns: &runtimeapi.DNSConfig{Searches: []string{"a b"}}, err: `"a b"`},
		{name: "newline in option", dns: &runtimeapi.DNSConfig{Options: []string{"ndots:1\nnameserver 6.6.6.6"}}, err: "DNS option"},
	} {
		got, err := resolvContent(tc.dns)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
