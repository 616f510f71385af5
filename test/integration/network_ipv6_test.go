package integration

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// testSubnet6 is an IPv6 pod subnet as private to the test as the IPv4
// subnet the harness gave it (10.A.B.0/24 -> fd00:10:A:B::/64).
func testSubnet6(t *testing.T, subnet string) netip.Prefix {
	t.Helper()
	a := netip.MustParsePrefix(subnet).Addr().As4()
	return netip.MustParsePrefix(fmt.Sprintf("fd00:10:%d:%d::/64", a[1], a[2]))
}

// podAddrs are the pod's addresses as PodSandboxStatus reports them: ip, then
// additional_ips.
func (e *podEnv) podAddrs(t *testing.T, pod string) []netip.Addr {
	t.Helper()
	st, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatal(err)
	}
	ips := []string{st.Status.GetNetwork().GetIp()}
	for _, ip := range st.Status.GetNetwork().GetAdditionalIps() {
		ips = append(ips, ip.GetIp())
	}
	var addrs []netip.Addr
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			t.Fatalf("pod %s: address %q: %v", pod, ip, err)
		}
		addrs = append(addrs, a)
	}
	return addrs
}

// dialFrom connects to addr (tcp, "[ip]:port") from the network namespace
// at netns ("" for the node's) and returns what the server says.
func dialFrom(t *testing.T, netns, addr string) (string, error) {
	t.Helper()
	var c net.Conn
	var err error
	dial := func() { c, err = net.DialTimeout("tcp", addr, 3*time.Second) }
	if netns == "" {
		dial()
	} else {
		inNetns(t, netns, dial)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return body, err
}

// TestDualStackPodNetwork: with [network] subnet6, a pod gets an IPv4 and
// an IPv6 address (PodSandboxStatus ip and additional_ips, in the
// subnets' order), and reaches another pod and the node over both
// families, and the node reaches it; its host port answers on the node's
// IPv6 address, from the node and from another pod; a restart keeps both
// addresses, and removing the pods returns both leases.
func TestDualStackPodNetwork(t *testing.T) {
	t.Parallel()
	bridge, subnet := harness.TestNetwork(t)
	subnet6 := testSubnet6(t, subnet)
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("\n[network]\nbridge = %q\nsubnet = %q\nsubnet6 = %q\n", bridge, subnet, subnet6))
	hp := freeHostPort(t)
	podA, _, _ := e.runWebPod(t, "dual-a", hp)
	podB, ctrB, _ := e.runWebPod(t, "dual-b", 0)
	a, b := e.podAddrs(t, podA), e.podAddrs(t, podB)
	for _, addrs := range [][]netip.Addr{a, b} {
		if len(addrs) != 2 || !netip.MustParsePrefix(subnet).Contains(addrs[0]) || !subnet6.Contains(addrs[1]) {
			t.Fatalf("pod addresses %v, want one in %s then one in %s", addrs, subnet, subnet6)
		}
	}
	netnsB := fmt.Sprintf("/proc/%d/ns/net", e.ctrPID(t, ctrB))
	for _, ip := range a {
		url := net.JoinHostPort(ip.String(), "8080")
		if got := httpGet(t, "http://"+url+"/"); !strings.Contains(got, "hello from dual-a") {
			t.Errorf("node -> pod A at %s: %q", url, got)
		}
		if got, err := dialFrom(t, netnsB, url); err != nil || !strings.Contains(got, "hello from dual-a") {
			t.Errorf("pod B -> pod A at %s: %q, %v", url, got, err)
		}
	}
	gw6 := subnet6.Addr().Next()
	hostPortURL := net.JoinHostPort(gw6.String(), fmt.Sprint(hp))
	if got := httpGet(t, "http://"+hostPortURL+"/"); !strings.Contains(got, "hello from dual-a") {
		t.Errorf("node -> host port %s: %q", hostPortURL, got)
	}
	if got, err := dialFrom(t, netnsB, hostPortURL); err != nil || !strings.Contains(got, "hello from dual-a") {
		t.Errorf("pod B -> host port %s: %q, %v", hostPortURL, got, err)
	}
	// Pod B -> the node's IPv6 gateway address.
	ln, err := net.Listen("tcp6", net.JoinHostPort(gw6.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Read(make([]byte, 64)) // the request: closing with it unread would reset the connection
			fmt.Fprintf(c, "HTTP/1.0 200 OK\r\n\r\nnode saw %s", c.RemoteAddr())
			c.Close()
		}
	}()
	if got, err := dialFrom(t, netnsB, ln.Addr().String()); err != nil || !strings.Contains(got, "node saw ["+b[1].String()+"]") {
		t.Errorf("pod B -> node at %s: %q, %v; want it seen from %s", ln.Addr(), got, err, b[1])
	}

	e.d.Restart()
	if got := e.podAddrs(t, podA); len(got) != 2 || got[0] != a[0] || got[1] != a[1] {
		t.Errorf("after a restart pod A has %v, want %v", got, a)
	}
	if got := httpGet(t, "http://"+net.JoinHostPort(a[1].String(), "8080")+"/"); !strings.Contains(got, "hello from dual-a") {
		t.Errorf("node -> pod A over IPv6 after a restart: %q", got)
	}
	e.removePod(t, podA)
	e.removePod(t, podB)
	e.assertNoLeaks(t)
}

// TestIPv6OnlyPodNetwork: the pod CIDR of an IPv6-only node gives pods an
// IPv6 address only, which the node reaches, and IPv6 host ports; a host
// port on an IPv4 host_ip is refused naming the field, and leaves nothing
// behind.
func TestIPv6OnlyPodNetwork(t *testing.T) {
	t.Parallel()
	bridge, subnet := harness.TestNetwork(t)
	cidr := testSubnet6(t, subnet)
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("\n[network]\nbridge = %q\n", bridge))
	_, err := e.d.Runtime.UpdateRuntimeConfig(t.Context(), &runtimeapi.UpdateRuntimeConfigRequest{
		RuntimeConfig: &runtimeapi.RuntimeConfig{NetworkConfig: &runtimeapi.NetworkConfig{PodCidr: cidr.String()}}})
	if err != nil {
		t.Fatalf("UpdateRuntimeConfig(%s) = %v", cidr, err)
	}
	hp := freeHostPort(t)
	pod, _, _ := e.runWebPod(t, "v6-only", hp)
	addrs := e.podAddrs(t, pod)
	if len(addrs) != 1 || !cidr.Contains(addrs[0]) {
		t.Fatalf("pod addresses %v, want one in %s", addrs, cidr)
	}
	if got := httpGet(t, "http://"+net.JoinHostPort(addrs[0].String(), "8080")+"/"); !strings.Contains(got, "hello from v6-only") {
		t.Errorf("node -> pod over IPv6: %q", got)
	}
	hostPortURL := net.JoinHostPort(cidr.Addr().Next().String(), fmt.Sprint(hp))
	if got := httpGet(t, "http://"+hostPortURL+"/"); !strings.Contains(got, "hello from v6-only") {
		t.Errorf("node -> host port %s: %q", hostPortURL, got)
	}
	cfg := e.podConfig("v4-hostip")
	cfg.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 8080, HostPort: freeHostPort(t), HostIp: "127.0.0.1"}}
	_, err = e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "host_ip") {
		t.Errorf("a host port on an IPv4 host_ip on an IPv6-only node = %v, want FailedPrecondition naming host_ip", err)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
