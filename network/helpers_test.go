package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

func needRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root")
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// testEnv is a Network on a bridge, subnet, table and state dir of its own.
type testEnv struct {
	*Network
	dir string
}

// newEnv makes a test network with subnet 10.199.<random>.0/<bits> and
// removes everything it may have left (links, table, pins) at cleanup.
func newEnv(tb testing.TB, bits int, mod ...func(*Config)) *testEnv {
	tb.Helper()
	needRoot(tb)
	x, _ := rand.Int(rand.Reader, big.NewInt(256))
	id := randHex(3)
	dir := tb.TempDir()
	cfg := Config{
		Bridge:     "bt" + id,
		Subnet:     fmt.Sprintf("10.199.%d.0/%d", x, bits),
		MTU:        1500,
		Masquerade: true,
		StateDir:   filepath.Join(dir, "state"),
		TableName:  "bt" + id,
	}
	for _, f := range mod {
		f(&cfg)
	}
	var logs io.Writer = io.Discard
	if testing.Verbose() {
		logs = os.Stderr
	}
	n, err := New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cleanupNet(tb, cfg) })
	return &testEnv{Network: n, dir: dir}
}

func cleanupNet(tb testing.TB, cfg Config) {
	if br, err := netlink.LinkByName(cfg.Bridge); err == nil {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index {
				netlink.LinkDel(l)
			}
		}
		if err := netlink.LinkDel(br); err != nil {
			tb.Errorf("cleanup: delete bridge: %v", err)
		}
	}
	if c, err := nftables.New(); err == nil {
		for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyNetdev} {
			t := &nftables.Table{Name: cfg.TableName, Family: f}
			c.AddTable(t)
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				tb.Errorf("cleanup: delete table: %v", err)
			}
		}
	}
}

// newPod pins a fresh network namespace (lo up) and returns its ID and pin.
func (e *testEnv) newPod(tb testing.TB) (string, string) {
	tb.Helper()
	id := "pod" + randHex(8)
	dir := filepath.Join(e.dir, "pods", id)
	pins, err := podns.Create(podns.Options{Dir: dir, Kinds: []podns.Kind{podns.Net}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { podns.Remove(dir) })
	return id, pins[podns.Net]
}

// attach makes a pod and attaches it.
func (e *testEnv) attach(tb testing.TB, ports ...PortMapping) (id, pin string, a *Attachment) {
	tb.Helper()
	id, pin = e.newPod(tb)
	a, err := e.Attach(context.Background(), PodInfo{ID: id}, pin, ports)
	if err != nil {
		tb.Fatal(err)
	}
	return id, pin, a
}

// serve answers every TCP connection to :port in the pod with its name
// (and the client's address) and every UDP datagram likewise.
func serve(tb testing.TB, pin, name string, port int) {
	tb.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := podns.DoInNetNS(pin, func() (err error) {
		// Both families: IPv4 only on an IPv4-only pod network.
		if ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s from %s", name, c.RemoteAddr())
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 100)
		for {
			_, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(fmt.Appendf(nil, "%s from %s", name, addr), addr)
		}
	}()
}

// get connects to addr over network (tcp4, udp4, tcp6 or udp6), from the pod pinned
// at pin or from the host when pin is "", and returns the answer.
func get(pin, network, addr string) (string, error) {
	var c net.Conn
	dial := func() (err error) {
		c, err = net.DialTimeout(network, addr, 2*time.Second)
		return err
	}
	var err error
	if pin == "" {
		err = dial()
	} else {
		err = podns.DoInNetNS(pin, dial)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if strings.HasPrefix(network, "udp") {
		if _, err := c.Write([]byte("hi")); err != nil {
			return "", err
		}
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

func mustGet(tb testing.TB, pin, network, addr, want string) string {
	tb.Helper()
	got, err := get(pin, network, addr)
	if err != nil || !strings.HasPrefix(got, want) {
		tb.Fatalf("%s %s (from %q): got %q, %v; want %q...", network, addr, pin, got, err, want)
	}
	return got
}

// elementsOf counts the map elements commented with the pod's ID.
func (e *testEnv) elementsOf(tb testing.TB, pod string) int {
	tb.Helper()
	c, err := nftables.New()
	if err != nil {
		tb.Fatal(err)
	}
	count := 0
	for _, f := range e.portFamilies() {
		anyIP, oneIP := e.portMaps(f)
		for _, s := range []*nftables.Set{anyIP, oneIP} {
			els, err := c.GetSetElements(s)
			if err != nil {
				tb.Fatal(err)
			}
			for _, el := range els {
				if el.Comment == pod {
					count++
				}
			}
		}
	}
	return count
}

// assertGone checks that nothing of pod is left: lease, host veth, rules.
func (e *testEnv) assertGone(tb testing.TB, pod string) {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "leases", pod)); !errors.Is(err, os.ErrNotExist) {
		tb.Errorf("lease of %s left (%v)", pod, err)
	}
	if _, ok := e.Lookup(pod); ok {
		tb.Errorf("Lookup(%s) still finds it", pod)
	}
	if _, err := netlink.LinkByName(vethName(pod)); err == nil {
		tb.Errorf("veth %s of %s left", vethName(pod), pod)
	}
	if n := e.elementsOf(tb, pod); n != 0 {
		tb.Errorf("%d host port elements of %s left", n, pod)
	}
	if e.hasGuardChain(tb, pod) {
		tb.Errorf("guard chain of %s left", pod)
	}
}

// hasGuardChain tells whether the guard table has the chain of the pod's
// host veth.
func (e *testEnv) hasGuardChain(tb testing.TB, pod string) bool {
	tb.Helper()
	c, err := nftables.New()
	if err != nil {
		tb.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		tb.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == e.cfg.TableName && ch.Name == vethName(pod) {
			return true
		}
	}
	return false
}

// leaseFiles lists the files in the lease folder, temp files included.
func (e *testEnv) leaseFiles(tb testing.TB) []string {
	tb.Helper()
	ents, err := os.ReadDir(filepath.Join(e.cfg.StateDir, "leases"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		tb.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// bridgePorts lists the links on the test bridge.
func (e *testEnv) bridgePorts(tb testing.TB) []string {
	tb.Helper()
	names, err := e.bridgeVeths()
	if err != nil {
		tb.Fatal(err)
	}
	return names
}

// ping sends one ICMP echo from the pod with busybox.
func ping(pin, ip string) error {
	out, err := exec.Command("nsenter", "--net="+pin, "busybox", "ping", "-c", "1", "-W", "2", ip).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s: %v: %s", ip, err, out)
	}
	return nil
}
