package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// freeHostPort is a TCP port nothing listens on now.
func freeHostPort(t *testing.T) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(harness.FreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	var p int32
	fmt.Sscan(port, &p)
	return p
}

// webServer serves "hello from NAME" on port 8080 with busybox httpd.
func webServer(name string) []string {
	return []string{"/bin/sh", "-c", fmt.Sprintf("mkdir -p /tmp/www && echo hello from %s > /tmp/www/index.html && exec /bin/busybox httpd -f -p 8080 -h /tmp/www", name)}
}

// runWebPod runs a pod whose container serves on 8080, published on
// hostPort when it is not 0, and returns the pod, its container and its IP.
func (e *podEnv) runWebPod(t *testing.T, name string, hostPort int32) (pod, ctr, ip string) {
	t.Helper()
	cfg := e.podConfig(name)
	if hostPort != 0 {
		cfg.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 8080, HostPort: hostPort}}
	}
	pod = e.runPod(t, cfg)
	ctr = e.createContainer(t, pod, cfg, "web", webServer(name)...)
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	return pod, ctr, e.podIP(t, pod)
}

func (e *podEnv) podIP(t *testing.T, pod string) string {
	t.Helper()
	st, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatal(err)
	}
	return st.Status.GetNetwork().GetIp()
}

// podGet fetches http://ip:port/ from inside a container with busybox nc
// (busybox-static's wget crashes in a rootfs without NSS libraries) and
// returns the body.
func (e *podEnv) podGet(t *testing.T, ctr, ip string, port int32) (string, int32) {
	t.Helper()
	r, err := e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: ctr, Timeout: 10,
		Cmd: []string{"/bin/sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | /bin/busybox nc -w 3 %s %d`, ip, port)}})
	if err != nil {
		t.Fatalf("exec in %s: %v", ctr, err)
	}
	_, body, _ := strings.Cut(string(r.Stdout), "\r\n\r\n")
	return body, r.ExitCode
}

// httpGet fetches url from the node, retrying briefly while the server starts.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for range 50 {
		resp, err := client.Get(url)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				return string(b)
			}
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("GET %s: %v", url, last)
	return ""
}

// network reads the bridge and subnet the harness gave this daemon.
func (e *podEnv) network(t *testing.T) (bridge string, subnet *net.IPNet) {
	t.Helper()
	b, err := os.ReadFile(e.d.Config)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`bridge = "([^"]+)"\s+subnet = "([^"]+)"`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("no [network] in %s", b)
	}
	_, subnet, err = net.ParseCIDR(m[2])
	if err != nil {
		t.Fatal(err)
	}
	return m[1], subnet
}

// builtinBridge is the bridge of the built-in network, if this daemon runs
// it and it exists (not in CNI mode).
func (e *podEnv) builtinBridge(t *testing.T) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(e.d.Config)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`bridge = "([^"]+)"`).FindStringSubmatch(string(b))
	if m == nil {
		return "", false
	}
	_, err = netlink.LinkByName(m[1])
	return m[1], err == nil
}

// bridgePorts counts the veths attached to the daemon's bridge.
func (e *podEnv) bridgePorts(t *testing.T) int {
	t.Helper()
	name, _ := e.network(t)
	if _, err := netlink.LinkByName(name); err != nil {
		t.Fatal(err)
	}
	return linksOn(t, name)
}

// linksOn counts the links attached to bridge (0 when it does not exist).
func linksOn(t *testing.T, bridge string) int {
	t.Helper()
	n, err := harness.BridgePorts(bridge)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *podEnv) leases(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(e.d.Root, "network", "leases", "*"))
	return files
}

func TestPodNetwork(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	_, subnet := e.network(t)
	hostPort := freeHostPort(t)

	podA, ctrA, ipA := e.runWebPod(t, "net-a", hostPort)
	podB, ctrB, ipB := e.runWebPod(t, "net-b", 0)
	for _, ip := range []string{ipA, ipB} {
		if parsed := net.ParseIP(ip); parsed == nil || !subnet.Contains(parsed) {
			t.Fatalf("pod IP %q is not in the pod subnet %s", ip, subnet)
		}
	}
	if ipA == ipB {
		t.Fatalf("two pods got the same IP %s", ipA)
	}
	gateway := subnet.IP.To4()
	gateway = net.IPv4(gateway[0], gateway[1], gateway[2], gateway[3]+1)

	// The node reaches a pod by its IP, and by the host port on loopback and
	// on a node address.
	want := "hello from net-a\n"
	for _, url := range []string{
		fmt.Sprintf("http://%s:8080/", ipA),
		fmt.Sprintf("http://127.0.0.1:%d/", hostPort),
		fmt.Sprintf("http://%s:%d/", gateway, hostPort),
	} {
		if got := httpGet(t, url); got != want {
			t.Errorf("GET %s = %q, want %q", url, got, want)
		}
	}
	// Pod to pod, and a pod to itself through its host port (hairpin).
	if body, code := e.podGet(t, ctrB, ipA, 8080); body != want {
		t.Errorf("pod B → pod A: %q (exit %d)", body, code)
	}
	if body, code := e.podGet(t, ctrA, gateway.String(), hostPort); body != want {
		t.Errorf("pod A → its own host port: %q (exit %d)", body, code)
	}
	// A pod's loopback is its own: the node's host port is not there.
	if body, _ := e.podGet(t, ctrB, "127.0.0.1", hostPort); body != "" {
		t.Errorf("a pod-network pod reached the node's 127.0.0.1 host port: %q", body)
	}

	// A host-network pod sees the node's ports and reports no pod IP.
	hostCfg := e.podConfig("net-host")
	hostCfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}
	hostPod := e.runPod(t, hostCfg)
	hostCtr := e.createContainer(t, hostPod, hostCfg, "client", "/bin/sleep", "1000")
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: hostCtr}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, hostCtr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	if body, code := e.podGet(t, hostCtr, "127.0.0.1", hostPort); body != want {
		t.Errorf("host-network pod → 127.0.0.1 host port: %q (exit %d)", body, code)
	}
	if ip := e.podIP(t, hostPod); ip != "" {
		t.Errorf("host-network pod reports pod IP %q", ip)
	}

	// A second claim on the host port fails and leaves nothing behind.
	before := len(e.leases(t))
	dup := e.podConfig("net-dup")
	dup.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80, HostPort: hostPort}}
	_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: dup})
	assertCode(t, err, one(codes.AlreadyExists), fmt.Sprint(hostPort))
	if after := len(e.leases(t)); after != before {
		t.Errorf("a refused pod left a lease: %d → %d", before, after)
	}

	if n := e.bridgePorts(t); n != 2 {
		t.Errorf("%d veths on the bridge with two pod-network pods", n)
	}
	pods := []string{podA, podB, hostPod}
	for _, p := range pods {
		if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		assertPodGone(t, e.d, p)
	}
	if n := e.bridgePorts(t); n != 0 {
		t.Errorf("%d veths left on the bridge after removal", n)
	}
	if l := e.leases(t); len(l) != 0 {
		t.Errorf("leases left after removal: %v", l)
	}
	if _, err := (&http.Client{Timeout: time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/", hostPort)); err == nil {
		t.Error("the host port still answers after the pod was removed")
	}
}

// runPodsAtOnce runs n pods concurrently, config(i) each, and checks that
// every one got an address of its own.
func (e *podEnv) runPodsAtOnce(t *testing.T, n int, config func(i int) *runtimeapi.PodSandboxConfig) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: config(i)})
			if err != nil {
				t.Errorf("RunPodSandbox %d: %v", i, err)
				return
			}
			ids[i] = resp.PodSandboxId
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	seen := map[string]bool{}
	for _, id := range ids {
		ip := e.podIP(t, id)
		if ip == "" || seen[ip] {
			t.Errorf("pod %s got IP %q (empty or taken)", id, ip)
		}
		seen[ip] = true
	}
	return ids
}

// removePodsAtOnce stops and removes pods concurrently.
func (e *podEnv) removePodsAtOnce(t *testing.T, ids []string) {
	t.Helper()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
				t.Errorf("StopPodSandbox: %v", err)
			}
			if _, err := e.d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				t.Errorf("RemovePodSandbox: %v", err)
			}
		})
	}
	wg.Wait()
}

func TestConcurrentPodsGetDistinctIPs(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	ids := e.runPodsAtOnce(t, 50, func(i int) *runtimeapi.PodSandboxConfig { return e.podConfig(fmt.Sprint("many-", i)) })
	e.removePodsAtOnce(t, ids)
	for _, id := range ids {
		assertPodGone(t, e.d, id)
	}
	if n := e.bridgePorts(t); n != 0 {
		t.Errorf("%d veths left on the bridge", n)
	}
	if l := e.leases(t); len(l) != 0 {
		t.Errorf("%d leases left", len(l))
	}
}

// webPodAcrossRestart runs a web pod published on a host port, SIGKILLs
// and restarts berthd, and checks the pod keeps its IP and answers on it and
// on the host port.
func (e *podEnv) webPodAcrossRestart(t *testing.T, name string) (pod, ip string) {
	t.Helper()
	hostPort := freeHostPort(t)
	pod, _, ip = e.runWebPod(t, name, hostPort)
	e.d.Kill()
	e.d.Restart()
	if got := e.podIP(t, pod); got != ip {
		t.Errorf("pod IP after restart %q, want %q", got, ip)
	}
	want := "hello from " + name + "\n"
	for _, url := range []string{fmt.Sprintf("http://%s:8080/", ip), fmt.Sprintf("http://127.0.0.1:%d/", hostPort)} {
		if got := httpGet(t, url); got != want {
			t.Errorf("after restart GET %s = %q", url, got)
		}
	}
	return pod, ip
}

func TestPodNetworkSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	pod, _ := e.webPodAcrossRestart(t, "net-restart")
	if l := e.leases(t); len(l) != 1 {
		t.Errorf("leases after restart: %v", l)
	}
	e.removePod(t, pod)
	if !strings.Contains(e.d.Logs(), "reconnected to pod shim") {
		t.Error("berthd did not log reconnecting to the shim")
	}
}
