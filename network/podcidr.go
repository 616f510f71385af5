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

// ParsePodCIDR reads the kubelet's pod CIDR ("10.244.1.0/24", or a
// comma-separated list on a dual-stack node): its IPv4 range, which must be
// a network address with room for a gateway and pods.
func ParsePodCIDR(s string) (netip.Prefix, error) {
	for _, part := range strings.Split(s, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%w %q: %v", ErrBadPodCIDR, s, err)
		}
		if !p.Addr().Is4() {
			continue
		}
		if p != p.Masked() || p.Bits() > 30 {
			return netip.Prefix{}, fmt.Errorf("%w %q: %s is not an IPv4 network of at most /30", ErrBadPodCIDR, s, p)
		}
		return p, nil
	}
	return netip.Prefix{}, fmt.Errorf("%w %q: no IPv4 range (only IPv4 pod networks are supported)", ErrBadPodCIDR, s)
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
