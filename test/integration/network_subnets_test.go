package integration

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// bridgeGateways are the bridge's addresses, link-local ones left out.
func bridgeGateways(t *testing.T, bridge string) []netip.Prefix {
	t.Helper()
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(br, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			ip, _ := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// gatewayIn is the bridge's address in subnet: its first host address.
func gatewayIn(subnet netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(subnet.Addr().Next(), subnet.Bits())
}

// TestSubnetChangeKeepsOnlyTheNewGateways: berthd restarted with another
// subnet6, then with none, leaves the bridge with the gateways of its
// subnets only (an old IPv6 gateway would keep routing the old subnet to
// the bridge), and a pod started then gets the new subnet's address.
func TestSubnetChangeKeepsOnlyTheNewGateways(t *testing.T) {
	bridge, subnet := harness.TestNetwork(t)
	old6 := testSubnet6(t, subnet)
	new6 := netip.MustParsePrefix(strings.Replace(old6.String(), "fd00:10:", "fd00:12:", 1))
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("\n[network]\nbridge = %q\nsubnet = %q\nsubnet6 = %q\n", bridge, subnet, old6))
	gw4 := gatewayIn(netip.MustParsePrefix(subnet))
	if got, want := bridgeGateways(t, bridge), []netip.Prefix{gw4, gatewayIn(old6)}; !slices.Equal(got, want) {
		t.Fatalf("bridge addresses %v, want %v", got, want)
	}
	restartWith := func(from, to string) {
		t.Helper()
		b, err := os.ReadFile(e.d.Config)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(e.d.Config, []byte(strings.Replace(string(b), from, to, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		e.d.Restart()
	}

	restartWith(fmt.Sprintf("subnet6 = %q", old6), fmt.Sprintf("subnet6 = %q", new6))
	if got, want := bridgeGateways(t, bridge), []netip.Prefix{gw4, gatewayIn(new6)}; !slices.Equal(got, want) {
		t.Errorf("after subnet6 %s became %s: bridge addresses %v, want %v", old6, new6, got, want)
	}
	pod := e.runPod(t, e.podConfig("new-subnet6"))
	if addrs := e.podAddrs(t, pod); len(addrs) != 2 || !new6.Contains(addrs[1]) {
		t.Errorf("pod addresses %v, want the IPv6 one in %s", addrs, new6)
	}
	e.removePod(t, pod)

	restartWith(fmt.Sprintf("subnet6 = %q", new6), "")
	if got, want := bridgeGateways(t, bridge), []netip.Prefix{gw4}; !slices.Equal(got, want) {
		t.Errorf("after subnet6 was dropped: bridge addresses %v, want %v", got, want)
	}
	e.assertNoLeaks(t)
}

// TestLinkLocalPodSubnetRefused: a link-local range is no pod subnet,
// whether the kubelet's pod CIDR (InvalidArgument naming pod_cidr) or
// network.subnet6 (berthd does not start, naming the key), the two passing
// one check.
func TestLinkLocalPodSubnetRefused(t *testing.T) {
	bridge, subnet := harness.TestNetwork(t)
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("\n[network]\nbridge = %q\n", bridge))
	cidr := subnet + ",fe80::/64"
	_, err := e.d.Runtime.UpdateRuntimeConfig(ctx(t), &runtimeapi.UpdateRuntimeConfigRequest{
		RuntimeConfig: &runtimeapi.RuntimeConfig{NetworkConfig: &runtimeapi.NetworkConfig{PodCidr: cidr}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "pod_cidr") || !strings.Contains(err.Error(), "link-local") {
		t.Errorf("UpdateRuntimeConfig(%s) = %v, want InvalidArgument naming pod_cidr and link-local", cidr, err)
	}

	state := t.TempDir()
	config := fmt.Sprintf("[network]\nbridge = %q\nsubnet = %q\nsubnet6 = \"fe80::/64\"\n", bridge, subnet)
	code, out := harness.RunDaemonUntilExit(t, harness.Options{ConfigTOML: config, State: state, Socket: filepath.Join(state, "b.sock")})
	if code == 0 || !strings.Contains(out, "network.subnet6") || !strings.Contains(out, "link-local") {
		t.Errorf("berthd with subnet6 fe80::/64: exit %d, output:\n%s\nwant a failure naming network.subnet6 and link-local", code, out)
	}
}
