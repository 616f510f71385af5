package podfiles

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/berth-runtime/berth/cri/errkind"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type contents struct{ hosts, resolv, hostname []byte }

// build makes every file's content before anything is written, so bad input
// changes nothing.
func build(opts Options) (contents, error) {
	var c contents
	var err error
	name := opts.Hostname
	if opts.HostNetwork {
		if name, err = os.Hostname(); err != nil {
			return c, err
		}
	}
	if err := checkHostname(name); err != nil {
		return c, err
	}
	c.hostname = []byte(name + "\n")
	if opts.HostNetwork {
		c.hosts, err = os.ReadFile(hostHostsPath)
	} else {
		c.hosts, err = hostsContent(name, opts.PodIPs)
	}
	if err != nil {
		return c, fmt.Errorf("podfiles: hosts: %w", err)
	}
	if opts.DNS == nil {
		c.resolv, err = os.ReadFile(hostResolvPath)
	} else {
		c.resolv, err = resolvContent(opts.DNS)
	}
	if err != nil {
		return c, fmt.Errorf("podfiles: resolv.conf: %w", err)
	}
	return c, nil
}

// The kubelet's managed hosts file starts the same way.
const hostsHeader = `# Kubernetes-managed hosts file (berth).
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
fe00::0	ip6-localnet
fe00::0	ip6-mcastprefix
fe00::1	ip6-allnodes
fe00::2	ip6-allrouters
`

func hostsContent(hostname string, ips []string) ([]byte, error) {
	if err := checkHostname(hostname); err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString(hostsHeader)
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return nil, fmt.Errorf("pod IP %q is not an IP address", ip)
		}
		fmt.Fprintf(&b, "%s\t%s\n", a, hostname)
	}
	return []byte(b.String()), nil
}

// resolvContent writes search before nameserver lines, as the kubelet and
// containerd do; the kubelet has already applied the glibc limits.
func resolvContent(dns *runtimeapi.DNSConfig) ([]byte, error) {
	var b strings.Builder
	if err := checkWords("DNS search domain", dns.GetSearches()); err != nil {
		return nil, err
	}
	if err := checkWords("DNS option", dns.GetOptions()); err != nil {
		return nil, err
	}
	if s := dns.GetSearches(); len(s) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(s, " "))
	}
	for _, s := range dns.GetServers() {
		if _, err := netip.ParseAddr(s); err != nil {
			return nil, errkind.Errorf(errkind.Invalid, "DNS server %q is not an IP address", s)
		}
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if o := dns.GetOptions(); len(o) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(o, " "))
	}
	return []byte(b.String()), nil
}

// checkHostname keeps the name to one printable word: it lands on a hosts
// line and in a file read by the kernel's sethostname limits (64 bytes).
func checkHostname(name string) error {
	if name == "" || len(name) > 64 || !isWord(name) {
		return errkind.Errorf(errkind.Invalid, "podfiles: hostname %q is not a valid host name", name)
	}
	return nil
}

// checkWords refuses values that would break a resolv.conf line (or add one).
func checkWords(what string, words []string) error {
	for _, w := range words {
		if !isWord(w) {
			return errkind.Errorf(errkind.Invalid, "%s %q is empty or has spaces or control characters", what, w)
		}
	}
	return nil
}

func isWord(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}
