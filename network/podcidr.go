package network

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-runtime/berth/cri/errkind"
)

// Errors of SetPodCIDR callers tell apart (wrapped, with the details).
var (
	ErrBadPodCIDR   = errkind.New(errkind.Invalid, "network: bad pod CIDR")
	ErrSubnetInUse  = errkind.New(errkind.FailedPrecondition, "network: pods hold addresses in the current subnet")
	podCIDRFileName = "pod-cidr"
)

// ParsePodCIDR reads the kubelet's pod CIDR ("10.244.1.0/24", or on a
// dual-stack node a comma-separated list such as
// "10.244.1.0/24,fd00:10:244:1::/64"): one range per family, in its order
// (the first family's address is the pod's IP), each a network address
// with room for a gateway and pods.
func ParsePodCIDR(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrBadPodCIDR, s, err)
		}
		if err := CheckSubnet(p); err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrBadPodCIDR, s, err)
		}
		for _, q := range out {
			if q.Addr().Is4() == p.Addr().Is4() {
				return nil, fmt.Errorf("%w %q: two ranges of one family (%s, %s)", ErrBadPodCIDR, s, q, p)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// CheckSubnet accepts a pod subnet, configured (network.subnet, subnet6:
// berthd's configuration checks them with it) or the kubelet's pod CIDR: a
// network address of unicast addresses, at least a /29 (IPv4) or a /120
// (IPv6), which leaves room for the gateway and a few pods.
func CheckSubnet(p netip.Prefix) error {
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return fmt.Errorf("%s is not a plain IPv4 or IPv6 network", p)
	}
	if p != p.Masked() {
		return fmt.Errorf("%s is not a network address (%s?)", p, p.Masked())
	}
	smallest := 29
	if p.Addr().Is6() {
		smallest = 120
	}
	if p.Bits() > smallest {
		return fmt.Errorf("%s is too small (at most /%d)", p, smallest)
	}
	for _, r := range notForPods {
		if p.Overlaps(r.prefix) {
			return fmt.Errorf("%s overlaps %s (%s): pods need unicast addresses", p, r.prefix, r.what)
		}
	}
	return nil
}

// notForPods are the ranges whose addresses are not a pod's to hold.
var notForPods = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this network"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("224.0.0.0/3"), "multicast and reserved"},
	{netip.MustParsePrefix("::/127"), "unspecified and loopback"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// SavePodCIDR keeps the kubelet's pod CIDR in dir across restarts (the
// kubelet sends it again only when it changes), replacing the file whole.
func SavePodCIDR(dir, cidr string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	path := filepath.Join(dir, podCIDRFileName)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(cidr+"\n"), 0o600); err != nil {
		return fmt.Errorf("network: save pod CIDR: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("network: save pod CIDR: %w", err)
	}
	return nil
}

// LoadPodCIDR returns what SavePodCIDR kept in dir, "" when the kubelet
// never sent one.
func LoadPodCIDR(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, podCIDRFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("network: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
