package network

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

var bg = context.Background()

// hostPort picks a port below the ephemeral range, so that no local
// listener on an ephemeral port is hijacked while a test runs.
func hostPort() int32 {
	x, _ := rand.Int(rand.Reader, big.NewInt(10000))
	return int32(20000 + x.Int64())
}

func TestPodToPodAndNode(t *testing.T) {
	e := newEnv(t, 24)
	if ok, why := e.Ready(); ok || why == "" {
		t.Errorf("Ready before Setup = %v, %q", ok, why)
	}
	idA, pinA, a := e.attach(t)
	_, pinB, b := e.attach(t)
	if ok, why := e.Ready(); !ok {
		t.Fatalf("not Ready after Attach: %s", why)
	}
	if a.IP.Equal(b.IP) || !a.Gateway.Equal(b.Gateway) {
		t.Fatalf("attachments %+v %+v", a, b)
	}
	serve(t, pinA, "A", 8080)

	if err := ping(pinB, a.IP.String()); err != nil {
		t.Error(err)
	}
	got := mustGet(t, pinB, "tcp4", net.JoinHostPort(a.IP.String(), "8080"), "A")
	if want := "A from " + b.IP.String() + ":"; !strings.HasPrefix(got, want) {
		t.Errorf("pod to pod: %q, want the client's own address %q", got, want)
	}
	mustGet(t, pinB, "udp4", net.JoinHostPort(a.IP.String(), "8080"), "A")
	mustGet(t, "", "tcp4", net.JoinHostPort(a.IP.String(), "8080"), "A from "+a.Gateway.String())

	// Inside the pod: eth0 with the MTU, lo up.
	err := podns.DoInNetNS(pinA, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if eth0.Attrs().MTU != 1500 || eth0.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("eth0 %+v", eth0.Attrs())
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("lo not up: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if l, ok := e.Lookup(idA); !ok || !l.IP.Equal(a.IP) || l.HostVeth != a.HostVeth {
		t.Errorf("Lookup = %+v, %v; want %+v", l, ok, a)
	}
	veth, err := netlink.LinkByName(a.HostVeth)
	if err != nil || !hairpin(t, veth) {
		t.Errorf("host veth %s: %v, hairpin off", a.HostVeth, err)
	}
}

// TestPortGuard checks what Attach sets up to guard a pod's port: the pod's
// MAC, derived from its address and recorded in its lease; the host veth's
// sysctls; and the port's chain, hooked on the veth, which Setup rewrites
// (with the MAC pinned only where the lease has one, and without the
// bridge-family table of older berthds) and Reconcile removes with the pod.
func TestPortGuard(t *testing.T) {
	e := newEnv(t, 24)
	id, pin, a := e.attach(t)
	l, err := e.leases.get(id)
	if err != nil {
		t.Fatal(err)
	}
	if want := derivedMAC(podMACKind, l.IP); !slices.Equal(l.MAC, macAddr(want)) {
		t.Errorf("lease MAC %s, want %s", net.HardwareAddr(l.MAC), want)
	}
	err = podns.DoInNetNS(pin, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err == nil && !slices.Equal(eth0.Attrs().HardwareAddr, net.HardwareAddr(l.MAC)) {
			err = fmt.Errorf("eth0 has MAC %s, the lease %s", eth0.Attrs().HardwareAddr, net.HardwareAddr(l.MAC))
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
	hostVethSysctls := map[string]string{
		"net/ipv6/conf/" + a.HostVeth + "/disable_ipv6": "1",
		"net/ipv4/conf/" + a.HostVeth + "/rp_filter":    "1",
	}
	checkHostVeth := func(when string) {
		t.Helper()
		for key, want := range hostVethSysctls {
			if b, err := os.ReadFile("/proc/sys/" + key); err != nil || strings.TrimSpace(string(b)) != want {
				t.Errorf("%s: %s = %q, %v; want %s", when, key, b, err, want)
			}
		}
	}
	checkHostVeth("after Attach")
	full := len(e.guardRules(t, id))
	if full != len(forbidden(l)) {
		t.Errorf("the port's chain has %d rules, want %d", full, len(forbidden(l)))
	}

	// A restart after an upgrade: a lease without a MAC, a host veth
	// without the sysctls (an older berthd set none), and the table of
	// the berthd before, which Setup deletes.
	l.MAC = nil
	for key := range hostVethSysctls {
		if err := os.WriteFile("/proc/sys/"+key, []byte("0"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.leases.write(l); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	old := c.AddTable(&nftables.Table{Name: e.cfg.TableName, Family: nftables.TableFamilyBridge})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	n2, err := New(e.cfg, e.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Setup(); err != nil {
		t.Fatal(err)
	}
	checkHostVeth("after Setup on an older berthd's veth")
	if got := len(e.guardRules(t, id)); got != full-2 {
		t.Errorf("the chain of a port whose lease has no MAC has %d rules, want %d (no MAC rules)", got, full-2)
	}
	if _, err := c.ListTableOfFamily(old.Name, old.Family); err == nil {
		t.Error("Setup kept the bridge-family guard table of an older berthd")
	}
	if err := n2.Reconcile(bg, nil); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, id)
}

// guardRules lists the rules of the chain of the pod's port; none when it
// has no chain.
func (e *testEnv) guardRules(t *testing.T, pod string) []*nftables.Rule {
	t.Helper()
	if !e.hasGuardChain(t, pod) {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := c.GetRules(e.guardTable(), &nftables.Chain{Name: vethName(pod)})
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// hairpin reads the bridge port's hairpin flag.
func hairpin(t *testing.T, link netlink.Link) bool {
	t.Helper()
	pi, err := netlink.LinkGetProtinfo(link)
	if err != nil {
		t.Fatal(err)
	}
	return pi.Hairpin
}

func TestHostPorts(t *testing.T) {
	e := newEnv(t, 24)
	hp, hpUDP, hpOne := hostPort(), hostPort(), hostPort()
	for hpUDP == hp || hpOne == hp || hpOne == hpUDP {
		hpUDP, hpOne = hostPort(), hostPort()
	}
	_, pinA, a := e.attach(t,
		PortMapping{Protocol: "TCP", ContainerPort: 8080, HostPort: hp},
		PortMapping{Protocol: "udp", ContainerPort: 8080, HostPort: hpUDP},
		PortMapping{Protocol: "tcp", ContainerPort: 8080}, // no host port: nothing to do
	)
	serve(t, pinA, "A", 8080)
	gw := a.Gateway.String()
	idC, pinC, _ := e.attach(t, PortMapping{ContainerPort: 9090, HostPort: hpOne, HostIP: gw})
	serve(t, pinC, "C", 9090)
	_, pinB, b := e.attach(t)

	at := func(ip string, p int32) string { return net.JoinHostPort(ip, fmt.Sprint(p)) }

	// From the node, on loopback: masqueraded to the gateway.
	mustGet(t, "", "tcp4", at("127.0.0.1", hp), "A from "+gw+":")
	mustGet(t, "", "udp4", at("127.0.0.1", hpUDP), "A from "+gw+":")
	// From the node, on its bridge address.
	mustGet(t, "", "tcp4", at(gw, hp), "A")
	// Hairpin: the pod reaches itself through the node.
	mustGet(t, pinA, "tcp4", at(gw, hp), "A from "+gw+":")
	mustGet(t, pinA, "udp4", at(gw, hpUDP), "A")
	// Another pod through the node.
	mustGet(t, pinB, "tcp4", at(gw, hp), "A")
	// A pod reaching a pod by IP needs no host port.
	mustGet(t, pinB, "tcp4", at(a.IP.String(), 8080), "A from "+b.IP.String())

	// host_ip limits a mapping to that address.
	mustGet(t, "", "tcp4", at(gw, hpOne), "C")
	mustGet(t, pinC, "tcp4", at(gw, hpOne), "C")
	if got, err := get("", "tcp4", at("127.0.0.1", hpOne)); err == nil {
		t.Errorf("host port bound to %s answered on 127.0.0.1: %q", gw, got)
	}
	if n := e.elementsOf(t, idC); n != 1 {
		t.Errorf("pod C has %d elements, want 1", n)
	}
	if got := e.attachmentPorts(t, idC); len(got) != 1 || got[0].HostIP != gw || got[0].Protocol != "tcp" {
		t.Errorf("Lookup ports = %+v", got)
	}

}

// TestLoopbackProtected: route_localnet on the bridge must not let a pod
// reach the node's loopback services by routing 127.0.0.1 to the gateway.
func TestLoopbackProtected(t *testing.T) {
	e := newEnv(t, 24)
	_, pin, a := e.attach(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
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
			c.Write([]byte("node loopback"))
			c.Close()
		}
	}()
	// The pod plays the attacker: its 127.0.0.0/8 goes to the gateway.
	err = podns.DoInNetNS(pin, func() error {
		for _, p := range []string{"all", "eth0"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+p+"/route_localnet", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		lo, _ := netlink.LinkByName("lo")
		loop := &net.IPNet{IP: net.IPv4(127, 0, 0, 0), Mask: net.CIDRMask(8, 32)}
		// Dropping lo's address drops its local routes.
		if err := netlink.AddrDel(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)}}); err != nil {
			return fmt.Errorf("del 127.0.0.1 from lo: %w", err)
		}
		return netlink.RouteAdd(&netlink.Route{Dst: loop, Gw: a.Gateway})
	})
	if err != nil {
		t.Fatal(err)
	}
	// Two rules stop it: the input rule of the ip table and the port's
	// guard chain. Without both the attack works: the test is sound.
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	input := &nftables.Chain{Name: "input", Table: e.table(ipv4)}
	guard := &nftables.Chain{Name: a.HostVeth, Table: e.guardTable()}
	flush := func(chains ...*nftables.Chain) {
		t.Helper()
		if err := e.Setup(); err != nil {
			t.Fatal(err)
		}
		for _, ch := range chains {
			c.FlushChain(ch)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	flush(input, guard)
	mustGet(t, pin, "tcp4", ln.Addr().String(), "node loopback")
	// Either one alone gives the pod nothing.
	for _, without := range []*nftables.Chain{input, guard} {
		flush(without)
		if got, err := get(pin, "tcp4", ln.Addr().String()); err == nil {
			t.Errorf("without chain %s, a pod reached the node's loopback listener: %q", without.Name, got)
		}
	}
}

func (e *testEnv) attachmentPorts(t *testing.T, pod string) []PortMapping {
	a, ok := e.Lookup(pod)
	if !ok {
		t.Fatalf("Lookup(%s) found nothing", pod)
	}
	return a.Ports
}

func TestMasqueradeEgress(t *testing.T) {
	e := newEnv(t, 24)
	// An "outside" host: a namespace on a veth /30 with no route back to
	// the pod subnet, so only masqueraded traffic gets answers.
	_, outPin := e.newPod(t)
	hostEnd := "bo" + randHex(4)
	x, _ := rand.Int(rand.Reader, big.NewInt(64))
	hostIP := net.IPv4(10, 198, byte(x.Int64()), 1)
	outIP := net.IPv4(10, 198, byte(x.Int64()), 2)
	f, err := os.Open(outPin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = hostEnd
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(f.Fd())}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { delVeth(hostEnd) })
	link, _ := netlink.LinkByName(hostEnd)
	mask := net.CIDRMask(30, 32)
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: hostIP, Mask: mask}}); err != nil {
		t.Fatal(err)
	}
	netlink.LinkSetUp(link)
	err = podns.DoInNetNS(outPin, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: outIP, Mask: mask}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, outPin, "outside", 7070)

	_, pin, _ := e.attach(t)
	mustGet(t, pin, "tcp4", net.JoinHostPort(outIP.String(), "7070"), "outside from "+hostIP.String()+":")
}

func TestConcurrentAttach(t *testing.T) {
	e := newEnv(t, 24)
	const n = 50
	ids := make([]string, n)
	pins := make([]string, n)
	for i := range ids {
		ids[i], pins[i] = e.newPod(t)
	}
	ips := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range ids {
		wg.Go(func() {
			a, err := e.Attach(bg, PodInfo{ID: ids[i]}, pins[i], []PortMapping{{ContainerPort: 80, HostPort: int32(21000 + i)}})
			if err != nil {
				errs <- err
				return
			}
			ips[i] = a.IP.String()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	slices.Sort(ips)
	if len(slices.Compact(slices.Clone(ips))) != n {
		t.Errorf("addresses not distinct: %v", ips)
	}
	if got := len(e.leaseFiles(t)); got != n {
		t.Errorf("%d lease files, want %d", got, n)
	}
	for i := range ids {
		wg.Go(func() {
			if err := e.Detach(bg, PodInfo{ID: ids[i]}, ""); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		e.assertGone(t, id)
	}
	if files := e.leaseFiles(t); len(files) != 0 {
		t.Errorf("lease files left: %v", files)
	}
}

func TestDuplicateHostPort(t *testing.T) {
	e := newEnv(t, 24)
	hp := hostPort()
	idA, _, a := e.attach(t, PortMapping{ContainerPort: 80, HostPort: hp})
	for _, pm := range []PortMapping{
		{ContainerPort: 81, HostPort: hp},
		{ContainerPort: 81, HostPort: hp, HostIP: "127.0.0.1"},
	} {
		id, pin := e.newPod(t)
		_, err := e.Attach(bg, PodInfo{ID: id}, pin, []PortMapping{{Protocol: "udp", ContainerPort: 53, HostPort: hp}, pm})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("tcp/%d", hp)) || !strings.Contains(err.Error(), idA) {
			t.Fatalf("duplicate host port: err = %v", err)
		}
		e.assertGone(t, id)
	}
	// The same port over UDP is another port.
	idU, _, _ := e.attach(t, PortMapping{Protocol: "udp", ContainerPort: 53, HostPort: hp})
	if n := e.elementsOf(t, idU); n != 1 {
		t.Errorf("udp pod has %d elements", n)
	}
	// Twice the same host port in one pod, to different container ports.
	id, pin := e.newPod(t)
	if _, err := e.Attach(bg, PodInfo{ID: id}, pin, []PortMapping{{ContainerPort: 1, HostPort: 29999}, {ContainerPort: 2, HostPort: 29999}}); err == nil {
		t.Error("one pod mapping a host port twice: no error")
	}
	e.assertGone(t, id)
	if got := len(e.leaseFiles(t)); got != 2 {
		t.Errorf("%d lease files, want 2", got)
	}
	if n := e.elementsOf(t, idA); n != 1 {
		t.Errorf("pod A has %d elements, want 1", n)
	}
	if _, err := netlink.LinkByName(a.HostVeth); err != nil {
		t.Errorf("pod A's veth: %v", err)
	}
}

func TestDetach(t *testing.T) {
	e := newEnv(t, 24)
	hp := hostPort()
	id, pin, _ := e.attach(t, PortMapping{ContainerPort: 80, HostPort: hp}, PortMapping{ContainerPort: 80, HostPort: hp, Protocol: "sctp"})
	if n := e.elementsOf(t, id); n != 2 {
		t.Fatalf("%d elements, want 2", n)
	}
	if err := e.Detach(bg, PodInfo{ID: id}, ""); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, id)
	if err := e.Detach(bg, PodInfo{ID: id}, ""); err != nil {
		t.Errorf("second Detach: %v", err)
	}
	// The namespace is still there, without eth0.
	err := podns.DoInNetNS(pin, func() error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			return fmt.Errorf("eth0 still in the pod")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// The port is free again.
	e.attach(t, PortMapping{ContainerPort: 80, HostPort: hp})

	// Detach of a pod whose guard chain is gone already (a kernel before
	// 6.16 deletes it with its veth) deletes the rest.
	id3, _, _ := e.attach(t, PortMapping{ContainerPort: 80, HostPort: hp + 2})
	l3, err := e.leases.get(id3)
	if err != nil {
		t.Fatal(err)
	}
	if !e.hasGuardChain(t, id3) {
		t.Fatal("the attached pod has no guard chain")
	}
	if err := e.delGuard(l3); err != nil {
		t.Fatal(err)
	}
	if err := e.Detach(bg, PodInfo{ID: id3}, ""); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, id3)

	// Detach after the namespace is gone (a reboot, a removed pod).
	id2, pin2, a2 := e.attach(t, PortMapping{ContainerPort: 80, HostPort: hp + 1})
	if err := podns.Remove(filepath.Dir(pin2)); err != nil {
		t.Fatal(err)
	}
	// The veth goes with the namespace, asynchronously.
	for i := 0; i < 100; i++ {
		if _, err := netlink.LinkByName(a2.HostVeth); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.Detach(bg, PodInfo{ID: id2}, ""); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, id2)
}

func TestReconcileAndRestart(t *testing.T) {
	e := newEnv(t, 24)
	hp := hostPort()
	idA, pinA, a := e.attach(t, PortMapping{ContainerPort: 8080, HostPort: hp})
	idB, _, _ := e.attach(t, PortMapping{ContainerPort: 8080, HostPort: hp + 1})
	idC, _, _ := e.attach(t)
	serve(t, pinA, "A", 8080)

	// A restart: a new Network on the same state, which rewrites the
	// table from the leases, then reconciles with the pods that survive.
	n2, err := New(e.cfg, e.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Setup(); err != nil {
		t.Fatal(err)
	}
	if l, ok := n2.Lookup(idA); !ok || !l.IP.Equal(a.IP) || len(l.Ports) != 1 {
		t.Errorf("Lookup after restart = %+v, %v", l, ok)
	}
	mustGet(t, "", "tcp4", net.JoinHostPort("127.0.0.1", fmt.Sprint(hp)), "A")
	if err := n2.Reconcile(bg, map[string]bool{idA: true}); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, idB)
	e.assertGone(t, idC)
	if got := e.bridgePorts(t); !slices.Equal(got, []string{a.HostVeth}) {
		t.Errorf("bridge ports %v, want [%s]", got, a.HostVeth)
	}
	if n := e.elementsOf(t, idA); n != 1 {
		t.Errorf("pod A has %d elements, want 1", n)
	}
	mustGet(t, "", "tcp4", net.JoinHostPort("127.0.0.1", fmt.Sprint(hp)), "A")
	// B's port is free again; a new pod does not get A's address.
	_, _, d := e.attach(t, PortMapping{ContainerPort: 8080, HostPort: hp + 1})
	if d.IP.Equal(a.IP) {
		t.Errorf("new pod got A's address %s", a.IP)
	}

	// A veth on the bridge without any lease (lost state) goes too.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "bs" + randHex(4)
	br, _ := netlink.LinkByName(e.cfg.Bridge)
	attrs.MasterIndex = br.Attrs().Index
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: attrs.Name + "p"}); err != nil {
		t.Fatal(err)
	}
	if err := n2.Reconcile(bg, map[string]bool{idA: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(attrs.Name); err == nil {
		t.Error("stray veth survived Reconcile")
	}
}

func TestExhaustion(t *testing.T) {
	e := newEnv(t, 29) // .1 gateway, .2-.6 pods
	var ips []string
	for range 5 {
		_, _, a := e.attach(t)
		ips = append(ips, a.IP.String())
	}
	id, pin := e.newPod(t)
	_, err := e.Attach(bg, PodInfo{ID: id}, pin, nil)
	if want := "no free address in " + e.cfg.Subnet; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("6th pod in a /29: err = %v, want %q", err, want)
	}
	e.assertGone(t, id)
	base := strings.TrimSuffix(e.subnets[0].Addr().String(), "0")
	for i, ip := range ips {
		if want := fmt.Sprint(base, i+2); ip != want {
			t.Errorf("pod %d got %s, want %s", i, ip, want)
		}
	}
}

func TestAttachFailureLeaksNothing(t *testing.T) {
	e := newEnv(t, 24)
	hp := hostPort()
	regular := filepath.Join(t.TempDir(), "not-a-netns")
	os.WriteFile(regular, nil, 0o644)

	// A namespace with a default route already: the route fails after
	// the veth exists.
	_, busy := e.newPod(t)
	err := podns.DoInNetNS(busy, func() error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "x0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "x1"}); err != nil {
			return err
		}
		x0, _ := netlink.LinkByName("x0")
		x1, _ := netlink.LinkByName("x1")
		netlink.LinkSetUp(x1)
		if err := netlink.LinkSetUp(x0); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: x0.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
	})
	if err != nil {
		t.Fatal(err)
	}

	for name, path := range map[string]string{
		"missing":       "/nonexistent/netns",
		"regular file":  regular,
		"default route": busy,
	} {
		id := "pod" + randHex(8)
		_, err := e.Attach(bg, PodInfo{ID: id}, path, []PortMapping{{ContainerPort: 80, HostPort: hp}})
		if err == nil {
			t.Errorf("%s: Attach succeeded", name)
			continue
		}
		t.Logf("%s: %v", name, err)
		e.assertGone(t, id)
		if files := e.leaseFiles(t); len(files) != 0 {
			t.Errorf("%s: lease files left: %v", name, files)
		}
		if ports := e.bridgePorts(t); len(ports) != 0 {
			t.Errorf("%s: bridge ports left: %v", name, ports)
		}
	}

	// The transaction of the host ports and the guard chain fails after
	// the veth exists (the guard's table is gone): it adds neither, and
	// the veth and the lease go.
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(e.guardTable())
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	id, pin := e.newPod(t)
	_, err = e.Attach(bg, PodInfo{ID: id}, pin, []PortMapping{{ContainerPort: 80, HostPort: hp}})
	if err == nil || !strings.Contains(err.Error(), "add host ports and guard") {
		t.Fatalf("Attach without the guard's table: err = %v, want the failed transaction's", err)
	}
	e.assertGone(t, id)
	if files := e.leaseFiles(t); len(files) != 0 {
		t.Errorf("failed guard: lease files left: %v", files)
	}
	if ports := e.bridgePorts(t); len(ports) != 0 {
		t.Errorf("failed guard: bridge ports left: %v", ports)
	}
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}

	// The host port was released each time.
	e.attach(t, PortMapping{ContainerPort: 80, HostPort: hp})
}

func TestSetupIdempotent(t *testing.T) {
	e := newEnv(t, 24)
	for range 2 {
		if err := e.Setup(); err != nil {
			t.Fatal(err)
		}
	}
	if ok, why := e.Ready(); !ok {
		t.Fatal(why)
	}
	br, err := netlink.LinkByName(e.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != gatewayOf(e.subnets[0]).String()+"/24" {
		t.Errorf("bridge addresses %v", addrs)
	}
	b, _ := os.ReadFile("/proc/sys/net/ipv4/conf/" + e.cfg.Bridge + "/route_localnet")
	if strings.TrimSpace(string(b)) != "1" {
		t.Errorf("route_localnet = %q", b)
	}
	// A bridge deleted behind berth's back: Attach notices and repairs,
	// putting the running pods back on it.
	_, pinA, a := e.attach(t)
	serve(t, pinA, "A", 8080)
	// The bridge keeps its own MAC with ports on it.
	gw := gatewayOf(e.subnets[0]).As4()
	if br, _ := netlink.LinkByName(e.cfg.Bridge); !slices.Equal(br.Attrs().HardwareAddr, net.HardwareAddr{2, 0x62, gw[0], gw[1], gw[2], gw[3]}) {
		t.Errorf("bridge MAC %s", br.Attrs().HardwareAddr)
	}
	if err := netlink.LinkDel(br); err != nil {
		t.Fatal(err)
	}
	id, pin := e.newPod(t)
	if _, err := e.Attach(bg, PodInfo{ID: id}, pin, nil); err == nil {
		t.Fatal("Attach without a bridge succeeded")
	}
	if ok, why := e.Ready(); ok || !strings.Contains(why, e.cfg.Bridge) {
		t.Errorf("Ready = %v, %q", ok, why)
	}
	e.attach(t)
	mustGet(t, "", "tcp4", net.JoinHostPort(a.IP.String(), "8080"), "A")
}

func TestNewValidates(t *testing.T) {
	good := DefaultConfig()
	good.StateDir = t.TempDir()
	if _, err := New(good, nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Subnet = "10.89.1.0/16" }, "not a network address"},
		{func(c *Config) { c.Subnet = "fd00::/64" }, "IPv4"},
		{func(c *Config) { c.Subnet = "10.0.0.0/31" }, "too small"},
		{func(c *Config) { c.Subnet = "nope" }, "subnet"},
		{func(c *Config) { c.Subnet6 = "10.90.0.0/16" }, "IPv6"},
		{func(c *Config) { c.Subnet6 = "fd00::1/64" }, "not a network address"},
		{func(c *Config) { c.Subnet6 = "fd00::/127" }, "too small"},
		{func(c *Config) { c.Bridge = "a-very-long-bridge-name" }, "bridge name"},
		{func(c *Config) { c.Bridge = "br 0" }, "bridge name"},
		{func(c *Config) { c.TableName = "a;b" }, "table name"},
		{func(c *Config) { c.MTU = 100 }, "MTU"},
		{func(c *Config) { c.StateDir = "rel" }, "absolute"},
	} {
		c := good
		tc.mod(&c)
		if _, err := New(c, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", c, err, tc.want)
		}
	}
}

func TestNormalizePorts(t *testing.T) {
	got, err := normalizePorts([]PortMapping{
		{Protocol: "TCP", ContainerPort: 80, HostPort: 8080, HostIP: "0.0.0.0"},
		{Protocol: "", ContainerPort: 80, HostPort: 8080}, // same once normalized
		{Protocol: "udp", ContainerPort: 53, HostPort: 0}, // no host port
		{Protocol: "Sctp", ContainerPort: 9, HostPort: 9, HostIP: "::ffff:127.0.0.1"},
		{Protocol: "udp", ContainerPort: 9, HostPort: 9, HostIP: "FD00:0::1"},
	})
	want := []PortMapping{
		{Protocol: "tcp", ContainerPort: 80, HostPort: 8080},
		{Protocol: "sctp", ContainerPort: 9, HostPort: 9, HostIP: "127.0.0.1"},
		{Protocol: "udp", ContainerPort: 9, HostPort: 9, HostIP: "fd00::1"},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("normalizePorts = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []PortMapping{
		{Protocol: "icmp", ContainerPort: 1, HostPort: 1},
		{ContainerPort: 0, HostPort: 1},
		{ContainerPort: 1, HostPort: 70000},
		{ContainerPort: 1, HostPort: 1, HostIP: "fe80::1%eth0"},
		{ContainerPort: 1, HostPort: 1, HostIP: "localhost"},
	} {
		if _, err := normalizePorts([]PortMapping{bad}); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// BenchmarkAttachDetach reports Attach alone (mean, p50, p99) besides the
// pair's ns/op, for a pod with one host port.
func BenchmarkAttachDetach(b *testing.B) {
	e := newEnv(b, 24)
	if err := e.Setup(); err != nil {
		b.Fatal(err)
	}
	id, pin := e.newPod(b)
	ports := []PortMapping{{ContainerPort: 80, HostPort: hostPort()}}
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := e.Attach(bg, PodInfo{ID: id}, pin, ports); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		if err := e.Detach(bg, PodInfo{ID: id}, ""); err != nil {
			b.Fatal(err)
		}
	}
	var sum time.Duration
	for _, d := range took {
		sum += d
	}
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(sum)/float64(len(took)), "attach-ms")
	b.ReportMetric(ms(took[len(took)/2]), "attach-p50-ms")
	b.ReportMetric(ms(took[len(took)*99/100]), "attach-p99-ms")
}
