package podfiles

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// FuzzPodFiles builds hosts, resolv.conf and hostname from a CRI hostname,
// pod IP and DNS config: whatever is accepted must not add a line to any of
// them, and whatever is refused is an invalid argument.
func FuzzPodFiles(f *testing.F) {
	f.Add("web-0", "10.1.2.3", "10.96.0.10", "default.svc.cluster.local", "ndots:5")
	f.Add("a\nb", "::1", "fe80::1%eth0", "x y", "")
	f.Add("h", "10.0.0.1%zone", "fe80::1%eth0\nnameserver 6.6.6.6", "s", "o")
	f.Fuzz(func(t *testing.T, hostname, ip, server, search, option string) {
		c, err := build(Options{Hostname: hostname, PodIPs: []string{ip},
			DNS: &runtimeapi.DNSConfig{Servers: []string{server}, Searches: []string{search}, Options: []string{option}}})
		if err != nil {
			// The CRI fields are the caller's: refusing them is its error.
			// The pod IP comes from berth's own network.
			if _, ipErr := netip.ParseAddr(ip); ipErr == nil && !errors.Is(err, errkind.Invalid) {
				t.Errorf("refused with %v, not an invalid argument", err)
			}
			return
		}
		lines := func(b []byte) int { return strings.Count(string(b), "\n") }
		if n := lines(c.hostname); n != 1 {
			t.Errorf("hostname file has %d lines: %q", n, c.hostname)
		}
		if n, want := lines(c.hosts), lines([]byte(hostsHeader))+1; n != want {
			t.Errorf("hosts has %d lines, want %d: %q", n, want, c.hosts)
		}
		if n := lines(c.resolv); n != 3 {
			t.Errorf("resolv.conf has %d lines, want 3 (search, nameserver, options): %q", n, c.resolv)
		}
	})
}
