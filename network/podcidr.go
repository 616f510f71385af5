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
		if err := checkSubnet(p); err != nil {
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

// checkSubnet accepts a pod subnet: a network address with room for the
// network address, the gateway, a pod and (IPv4) the broadcast address.
func checkSubnet(p netip.Prefix) error {
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return fmt.Errorf("%s is not a plain IPv4 or IPv6 network", p)
	}
	if p != p.Masked() {
		return fmt.Errorf("%s is not a network address (%s?)", p, p.Masked())
	}
	if p.Bits() > p.Addr().BitLen()-2 {
		return fmt.Errorf("%s is too small (at most /%d)", p, p.Addr().BitLen()-2)
	}
	return nil
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
