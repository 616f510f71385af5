package integration

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cniPluginDir is where Debian's containernetworking-plugins (test/deps.sh)
// installs the reference plugins.
const cniPluginDir = "/usr/lib/cni"

var cniSeq atomic.Uint32

// cniNet is one test's CNI network: a configuration folder (empty until
// writeConf), a folder of extra plugins, and the names the reference
// plugins will use: a bridge, a /24 from 10.250-255.x (the harness gives
// built-in test networks 10.200-249.x) and host-local's lease folder.
// What a test checks of the node's nat table is what portmap commented with
// its network's name or its pods' IDs, so the CNI tests run in parallel.
type cniNet struct {
	name, bridge string
	subnet       *net.IPNet
	gateway      net.IP
	confDir      string
	binDir       string // extra plugins of the test, after cniPluginDir
	leaseDir     string // host-local's dataDir; leases in leaseDir/<name>/<ip>
}

func newCNINet(t *testing.T) *cniNet {
	t.Helper()
	if _, err := os.Stat(filepath.Join(cniPluginDir, "bridge")); err != nil {
		t.Fatalf("the reference CNI plugins are not installed (run test/deps.sh): %v", err)
	}
	n := cniSeq.Add(1)
	pid := os.Getpid()
	dir := t.TempDir()
	c := &cniNet{
		name:     fmt.Sprintf("berth-itest-%d-%d", pid, n),
		bridge:   fmt.Sprintf("bc%d-%d", pid%10000, n),
		confDir:  filepath.Join(dir, "net.d"),
		binDir:   filepath.Join(dir, "bin"),
		leaseDir: filepath.Join(dir, "ipam"),
	}
	_, c.subnet, _ = net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/24", 250+pid%6, n%256))
	c.gateway = net.IPv4(10, byte(250+pid%6), byte(n%256), 1).To4()
	if err := os.MkdirAll(c.binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Runs after the env's teardown (registered later) removed the pods.
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(c.bridge); err == nil {
			netlink.LinkDel(link)
		}
	})
	return c
}

// toml is the [network] table of a berthd on this network.
func (c *cniNet) toml() string {
	return fmt.Sprintf("\n[network]\nmode = \"cni\"\ncni_conf_dir = %q\ncni_bin_dirs = [%q, %q]\n", c.confDir, cniPluginDir, c.binDir)
}

// conflist is bridge (with host-local) + portmap + loopback, with extra
// plugins appended.
func (c *cniNet) conflist(extra ...string) string {
	plugins := []string{
		fmt.Sprintf(`{"type": "bridge", "bridge": %q, "isGateway": true, "hairpinMode": true,
			"ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}}`,
			c.bridge, c.subnet, c.leaseDir),
		`{"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}`,
		`{"type": "loopback"}`,
	}
	plugins = append(plugins, extra...)
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, "plugins": [%s]}`, c.name, strings.Join(plugins, ",\n"))
}

// writeConf drops a configuration file into the folder, as a cluster's
// network installer would (write, then rename).
func (c *cniNet) writeConf(t *testing.T, name, body string) {
	t.Helper()
	if err := os.MkdirAll(c.confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(c.confDir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.confDir, name)); err != nil {
		t.Fatal(err)
	}
}

// leases lists host-local's lease files (named after the address).
func (c *cniNet) leases(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(c.leaseDir, c.name, "*"))
	var out []string
	for _, f := range files {
		if net.ParseIP(filepath.Base(f)) != nil {
			out = append(out, filepath.Base(f))
		}
	}
	return out
}

// veths counts the links attached to the bridge (0 when it does not exist).
func (c *cniNet) veths(t *testing.T) int {
	t.Helper()
	return linksOn(t, c.bridge)
}

// natRules is the nat table's rules that mention any of words (portmap
// comments its rules with the network name and the container ID).
func natRules(t *testing.T, words ...string) []string {
	t.Helper()
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				rules = append(rules, line)
				break
			}
		}
	}
	return rules
}

var dnChainRE = regexp.MustCompile(`CNI-DN-[0-9a-f]+`)

// natChains lists the per-container chains (CNI-DN-…) the rules name.
func natChains(rules []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range rules {
		for _, c := range dnChainRE.FindAllString(r, -1) {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}

func natChainExists(t *testing.T, chain string) bool {
	t.Helper()
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	return strings.Contains(string(out), ":"+chain+" ")
}

// startCNIEnv is startPodEnv with berthd in CNI mode on c.
func startCNIEnv(t *testing.T, c *cniNet) *podEnv {
	t.Helper()
	reg, d := start(t, c.toml())
	e := newPodEnv(t, d, reg)
	e.image = e.pushImage(t, "berth/busybox:pods", v1.Config{})
	return e
}

// networkReady returns the NetworkReady condition.
func (e *podEnv) networkReady(t *testing.T) *runtimeapi.RuntimeCondition {
	t.Helper()
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Status.Conditions {
		if c.Type == runtimeapi.NetworkReady {
			return c
		}
	}
	t.Fatal("no NetworkReady condition")
	return nil
}

// recordsLeft lists berth's per-pod CNI records.
func (e *podEnv) cniRecords() []string {
	files, _ := filepath.Glob(filepath.Join(e.d.Root, "network", "cni", "pods", "*"))
	return files
}

// noPodPid is a pod config without a shared PID namespace: no pause
// process, so that its network namespace lives only as long as its pin.
func noPodPid(cfg *runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig {
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{
		Pid: runtimeapi.NamespaceMode_CONTAINER}}
	return cfg
}

func TestCNINetwork(t *testing.T) {
	t.Parallel()
	c := newCNINet(t)
	c.writeConf(t, "10-test.conflist", c.conflist())
	e := startCNIEnv(t, c)
	if cond := e.networkReady(t); !cond.Status {
		t.Fatalf("NetworkReady false with a valid configuration: %s %s", cond.Reason, cond.Message)
	}
	hostPort := freeHostPort(t)
	podA, ctrA, ipA := e.runWebPod(t, "cni-a", hostPort)
	podB, ctrB, ipB := e.runWebPod(t, "cni-b", 0)
	for _, ip := range []string{ipA, ipB} {
		if parsed := net.ParseIP(ip); parsed == nil || !c.subnet.Contains(parsed) {
			t.Fatalf("pod IP %q is not in the CNI network's subnet %s", ip, c.subnet)
		}
	}
	if ipA == ipB {
		t.Fatalf("two pods got the same IP %s", ipA)
	}
	if l := c.leases(t); len(l) != 2 {
		t.Errorf("host-local leases with two pods: %v", l)
	}
	st, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: podA})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Status.GetNetwork().GetAdditionalIps(); len(got) != 0 {
		t.Errorf("additional IPs on an IPv4-only network: %v", got)
	}
	rules := natRules(t, podA)
	chains := natChains(rules)
	if len(rules) == 0 || len(chains) == 0 {
		t.Fatalf("no portmap rules for pod A: %q", rules)
	}

	// The node reaches a pod by its IP, and by its host port on the node's
	// address and on 127.0.0.1 (portmap's snat and route_localnet).
	want := "hello from cni-a\n"
	for _, url := range []string{
		fmt.Sprintf("http://%s:8080/", ipA),
		fmt.Sprintf("http://%s:%d/", c.gateway, hostPort),
		fmt.Sprintf("http://127.0.0.1:%d/", hostPort),
	} {
		if got := httpGet(t, url); got != want {
			t.Errorf("GET %s = %q, want %q", url, got, want)
		}
	}
	// Pod to pod, and a pod to itself through its host port (hairpin).
	if body, code := e.podGet(t, ctrB, ipA, 8080); body != want {
		t.Errorf("pod B → pod A: %q (exit %d)", body, code)
	}
	if body, code := e.podGet(t, ctrA, c.gateway.String(), hostPort); body != want {
		t.Errorf("pod A → its own host port: %q (exit %d)", body, code)
	}
	// The loopback plugin brought the pod's lo up.
	if body, code := e.podGet(t, ctrA, "127.0.0.1", 8080); body != want {
		t.Errorf("pod A → its own 127.0.0.1:8080: %q (exit %d)", body, code)
	}

	// Stop runs DEL: the lease, the veth and the port rules go.
	if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: podA}); err != nil {
		t.Fatal(err)
	}
	if l := c.leases(t); len(l) != 1 || l[0] != ipB {
		t.Errorf("leases after pod A stopped: %v, want only %s", l, ipB)
	}
	if n := c.veths(t); n != 1 {
		t.Errorf("%d veths on the bridge with one pod left", n)
	}
	if r := natRules(t, podA); len(r) != 0 {
		t.Errorf("portmap rules of the stopped pod left: %q", r)
	}
	for _, ch := range chains {
		if natChainExists(t, ch) {
			t.Errorf("portmap chain %s of the stopped pod left", ch)
		}
	}
	if _, err := (&http.Client{Timeout: time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/", hostPort)); err == nil {
		t.Error("the host port still answers after the pod stopped")
	}

	for _, p := range []string{podA, podB} {
		e.removePod(t, p)
	}
	if l := c.leases(t); len(l) != 0 {
		t.Errorf("leases left after removal: %v", l)
	}
	if n := c.veths(t); n != 0 {
		t.Errorf("%d veths left on the bridge", n)
	}
	if r := natRules(t, c.name); len(r) != 0 {
		t.Errorf("portmap rules of the network left: %q", r)
	}
	if r := e.cniRecords(); len(r) != 0 {
		t.Errorf("CNI pod records left: %v", r)
	}
}

func TestCNIReadyWithoutRestart(t *testing.T) {
	t.Parallel()
	c := newCNINet(t)
	e := startCNIEnv(t, c) // no configuration folder yet
	cond := e.networkReady(t)
	if cond.Status || !strings.Contains(cond.Message, "no network configuration in "+c.confDir) {
		t.Fatalf("NetworkReady with no configuration = %v %q %q", cond.Status, cond.Reason, cond.Message)
	}
	_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: e.podConfig("cni-early")})
	assertCode(t, err, one(codes.Internal), "no network configuration", c.confDir)
	e.assertNoPodLeft(t, c)

	// A file that is not a configuration changes nothing.
	c.writeConf(t, "README", "the network installer writes here")
	if e.networkReady(t).Status {
		t.Fatal("NetworkReady true with no configuration file")
	}

	c.writeConf(t, "10-test.conflist", c.conflist())
	if cond := e.networkReady(t); !cond.Status {
		t.Fatalf("NetworkReady after a configuration appeared: %q %q", cond.Reason, cond.Message)
	}
	pod := e.runPod(t, e.podConfig("cni-late"))
	if ip := net.ParseIP(e.podIP(t, pod)); ip == nil || !c.subnet.Contains(ip) {
		t.Errorf("pod IP %v not in %s", ip, c.subnet)
	}
	e.removePod(t, pod)
	if l := c.leases(t); len(l) != 0 {
		t.Errorf("leases left: %v", l)
	}
	if !strings.Contains(e.d.Logs(), "CNI network configuration loaded") {
		t.Error("berthd did not log the configuration it loaded")
	}
}

// assertNoPodLeft checks that a refused RunPodSandbox left nothing: no pod,
// no pod folder or pin, no CNI record, no lease, no veth, no port rule.
func (e *podEnv) assertNoPodLeft(t *testing.T, c *cniNet) {
	t.Helper()
	pods, err := e.d.Runtime.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("pods left: %v, %v", pods.GetItems(), err)
	}
	if entries, _ := os.ReadDir(filepath.Join(e.d.State, "pods")); len(entries) != 0 {
		t.Errorf("pod folders left: %v", entries)
	}
	if m := mountsMentioning(filepath.Join(e.d.State, "pods") + "/"); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	if r := e.cniRecords(); len(r) != 0 {
		t.Errorf("CNI pod records left: %v", r)
	}
	if l := c.leases(t); len(l) != 0 {
		t.Errorf("leases left: %v", l)
	}
	if n := c.veths(t); n != 0 {
		t.Errorf("%d veths left on the bridge", n)
	}
	if r := natRules(t, c.name); len(r) != 0 {
		t.Errorf("port rules left: %q", r)
	}
}

func TestCNIBrokenConfiguration(t *testing.T) {
	t.Parallel()
	c := newCNINet(t)
	c.writeConf(t, "10-test.conflist", `{"cniVersion": "1.0.0", "name": "broken", "plugins": [`)
	// Exits non-zero at ADD, after bridge and portmap did their part.
	failing := "#!/bin/sh\ncat >/dev/null\ncase \"$CNI_COMMAND\" in\n" +
		"ADD) echo '{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"berth-fail refuses\"}'; exit 1;;\n" +
		"VERSION) echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}';;\nesac\n"
	if err := os.WriteFile(filepath.Join(c.binDir, "berth-fail"), []byte(failing), 0o755); err != nil {
		t.Fatal(err)
	}
	e := startCNIEnv(t, c)
	cfg := e.podConfig("cni-broken")
	cfg.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 8080, HostPort: freeHostPort(t)}}
	run := func() error {
		_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		return err
	}

	t.Run("bad JSON", func(t *testing.T) {
		cond := e.networkReady(t)
		if cond.Status || !strings.Contains(cond.Message, "10-test.conflist") {
			t.Errorf("NetworkReady with bad JSON = %v %q", cond.Status, cond.Message)
		}
		assertCode(t, run(), one(codes.Internal), "10-test.conflist", "JSON")
		e.assertNoPodLeft(t, c)
	})
	t.Run("missing plugin", func(t *testing.T) {
		c.writeConf(t, "10-test.conflist", c.conflist(`{"type": "berth-absent"}`))
		cond := e.networkReady(t)
		if cond.Status || !strings.Contains(cond.Message, `plugin "berth-absent" not found`) {
			t.Errorf("NetworkReady with a missing plugin = %v %q", cond.Status, cond.Message)
		}
		assertCode(t, run(), one(codes.Internal), `plugin "berth-absent" not found in `+cniPluginDir)
		e.assertNoPodLeft(t, c)
	})
	t.Run("plugin fails", func(t *testing.T) {
		c.writeConf(t, "10-test.conflist", c.conflist(`{"type": "berth-fail"}`))
		if cond := e.networkReady(t); !cond.Status {
			t.Errorf("NetworkReady = false (%q), want true: the plugins are there", cond.Message)
		}
		// bridge made a veth and leased an address, portmap added rules,
		// then berth-fail refused: DEL undoes all of it.
		assertCode(t, run(), one(codes.Internal), "berth-fail refuses", c.name)
		e.assertNoPodLeft(t, c)
		if _, err := netlink.LinkByName(c.bridge); err != nil {
			t.Errorf("the bridge plugin never ran: %v", err)
		}
	})
	t.Run("fixed", func(t *testing.T) {
		c.writeConf(t, "10-test.conflist", c.conflist())
		e.removePod(t, e.runPod(t, cfg))
		e.assertNoPodLeft(t, c)
	})
}

// DEL must run, and succeed, when the pod's network namespace is gone: its
// pin released behind berthd's back, or the machine rebooted.
func TestCNIDelWithoutNamespace(t *testing.T) {
	t.Parallel()
	c := newCNINet(t)
	c.writeConf(t, "10-test.conflist", c.conflist())
	e := startCNIEnv(t, c)
	hostPort := freeHostPort(t)
	cfgA := noPodPid(e.podConfig("cni-gone-a"))
	cfgA.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 8080, HostPort: hostPort}}
	podA := e.runPod(t, cfgA)
	podB := e.runPod(t, noPodPid(e.podConfig("cni-gone-b")))
	if l := c.leases(t); len(l) != 2 {
		t.Fatalf("leases: %v", l)
	}
	releaseNetns := func(pod string) {
		t.Helper()
		pin := filepath.Join(e.d.State, "pods", pod, "ns", "net")
		if err := unix.Unmount(pin, unix.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", pin, err)
		}
	}

	// A: the namespace goes while berthd runs; StopPodSandbox runs DEL
	// without one.
	ipA := e.podIP(t, podA)
	releaseNetns(podA)
	for deadline := time.Now().Add(5 * time.Second); c.veths(t) != 1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if c.veths(t) != 1 {
		t.Fatalf("the veth of pod A outlived its namespace: %d veths", c.veths(t))
	}
	if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: podA}); err != nil {
		t.Fatalf("StopPodSandbox with the namespace gone: %v", err)
	}
	for _, l := range c.leases(t) {
		if l == ipA {
			t.Errorf("the lease of pod A (%s) is still there after stop", ipA)
		}
	}
	if r := natRules(t, podA); len(r) != 0 {
		t.Errorf("port rules of pod A left: %q", r)
	}

	// B: a reboot, as recovery sees it: berthd and the pod's shim die and
	// the namespace pin is gone. At start berthd runs DEL for the pod.
	e.d.Kill()
	shimPID, err := os.ReadFile(filepath.Join(e.d.State, "pods", podB, "shim.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(shimPID)))
	if pid <= 0 || syscall.Kill(pid, syscall.SIGKILL) != nil {
		t.Fatalf("kill the shim of pod B (%q)", shimPID)
	}
	releaseNetns(podB)
	e.d.Restart()
	if l := c.leases(t); len(l) != 0 {
		t.Errorf("leases after berthd recovered from pod B's \"reboot\": %v", l)
	}
	if !strings.Contains(e.d.Logs(), "released the network of a pod that is gone") {
		t.Error("berthd did not log releasing pod B's network")
	}
	for _, p := range []string{podA, podB} {
		e.removePod(t, p)
	}
	e.assertNoPodLeft(t, c)
}

func TestCNIConcurrentPods(t *testing.T) {
	c := newCNINet(t)
	c.writeConf(t, "10-test.conflist", c.conflist())
	e := startCNIEnv(t, c)
	const n = 50
	ids := e.runPodsAtOnce(t, n, func(i int) *runtimeapi.PodSandboxConfig {
		return noPodPid(e.podConfig(fmt.Sprint("cni-many-", i)))
	})
	if l := c.leases(t); len(l) != n {
		t.Errorf("%d leases for %d pods", len(l), n)
	}
	e.removePodsAtOnce(t, ids)
	e.assertNoPodLeft(t, c)
}

func TestCNISurvivesRestart(t *testing.T) {
	t.Parallel()
	c := newCNINet(t)
	c.writeConf(t, "10-test.conflist", c.conflist())
	e := startCNIEnv(t, c)
	pod, ip := e.webPodAcrossRestart(t, "cni-restart")
	if l := c.leases(t); len(l) != 1 || l[0] != ip {
		t.Errorf("leases after restart: %v", l)
	}
	// At start berthd runs CHECK for running pods and logs the outcome.
	switch logs := e.d.Logs(); {
	case strings.Contains(logs, "CNI CHECK passed"):
	case strings.Contains(logs, "CNI CHECK failed") && strings.Contains(logs, "could not check ipv6 dnat"):
		// Debian's portmap 1.1.1 looks for IPv6 rules an IPv4-only pod
		// does not have (containernetworking/plugins#819, fixed later).
		t.Log("portmap's CHECK fails for IPv4-only pods with host ports (plugins#819): logged, not fatal")
	default:
		t.Error("berthd did not CHECK the running pod's network at start, or CHECK failed for another reason")
	}
	e.removePod(t, pod)
	e.assertNoPodLeft(t, c)
}
