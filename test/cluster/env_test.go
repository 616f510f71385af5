package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// guardEnv must be "1" (and the test run as root) for the tier to run.
const guardEnv = "BERTH_CLUSTER"

// The cluster's addresses, all in 172.29.0.0/16 (which the tier checks no
// route of the host touches): the node's own address, on a link the test
// makes (the kubelet refuses a loopback node IP; a bridge without ports,
// which every kernel that runs berth has, unlike the dummy driver), the pod
// range the controller-manager cuts the node's /24 from, and the service range.
const (
	nodeName    = "berth-node"
	nodeIP      = "172.29.255.1"
	clusterCIDR = "172.29.0.0/17"
	serviceCIDR = "172.29.128.0/24"
	apiService  = "172.29.128.1" // the kubernetes Service, first of serviceCIDR
	testRange   = "172.29.0.0/16"
)

// hostSysctls are the kernel settings the kubelet (protectKernelDefaults:
// false), kube-proxy and berth's network may change; they are restored at
// the end.
var hostSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
	"kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet", "net/netfilter/nf_conntrack_max"}

// hostPaths are written by the kubelet whatever its flags say: the device
// plugin socket's folder and /var/log/containers (its symlinks to the pod
// logs). The test removes those of them it finds missing at start.
var hostPaths = []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins", "/var/log/containers"}

const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// env is one run of the tier: a loopback registry, etcd, the control plane,
// berthd, a kubelet and kube-proxy, all on folders of this run under work.
type env struct {
	t      *testing.T
	work   string // everything the run creates on disk lives below
	binDir string // berthd, berth-shim (make build)
	k8sBin string // etcd and the Kubernetes binaries (make test-cluster)

	reg      *registry
	imageV1  string // 127.0.0.1:PORT/berth/web:v1
	imageV2  string // the same with /etc/web-version "v2"
	pki      *pki
	admin    string // the admin's kubeconfig (system:masters)
	link     string // the portless bridge holding nodeIP
	sysctls  map[string]string
	hostDirs []string // hostPaths missing at start

	etcd, apiserver, controllers, scheduler *proc
	apiPort                                 int

	berthd   *proc
	berthArg []string
	bridge   string
	root     string // berthd --root
	state    string // berthd --state
	socket   string
	conn     *grpc.ClientConn
	rt       runtimeapi.RuntimeServiceClient

	kubelet     *proc
	kubeletArg  []string
	kubeletRoot string
	healthz     int
	cgroupRoot  string   // the kubelet's cgroupRoot, "/berth-cluster-PID"
	hierarchies []string // cgroup mount points the cgroup root was made in
	kubeProxy   *proc

	hostPort, hostNetPort int // of the hostport and hostnet pods
}

// repoRoot is berth's repository (this module lives in test/cluster).
func repoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

func requireTier(t *testing.T) {
	t.Helper()
	if os.Getenv(guardEnv) != "1" {
		t.Skipf("set %s=1 (root) to run the whole-flow cluster tier (make test-cluster)", guardEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s=1 needs root (euid is %d)", guardEnv, os.Geteuid())
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// newEnv checks the host and the binaries, then starts everything; each part
// is stopped and removed by cleanups registered here, in reverse order.
func newEnv(t *testing.T) *env {
	t.Helper()
	repo := repoRoot(t)
	e := &env{t: t,
		binDir: envOr("BERTH_BIN_DIR", filepath.Join(repo, "bin")),
		k8sBin: envOr("CLUSTER_BIN_DIR", filepath.Join(repo, "bin", "cluster")),
	}
	for _, p := range []string{e.berthBin("berthd"), e.berthBin("berth-shim"), e.bin("etcd"), e.bin("kube-apiserver"),
		e.bin("kube-controller-manager"), e.bin("kube-scheduler"), e.bin("kubelet"), e.bin("kube-proxy"), e.bin("kubectl")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v: build it with `make test-cluster` (or set BERTH_BIN_DIR / CLUSTER_BIN_DIR)", err)
		}
	}
	checkHost(t)
	// Short: unix socket paths must stay below 108 bytes. Traversable, as /run
	// is for berthd's default state folder: the init of a hostUsers: false
	// container reaches its bundle through it.
	work, err := os.MkdirTemp("", "bc-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(work, 0o711); err != nil {
		t.Fatal(err)
	}
	e.work = work
	t.Cleanup(e.removeWork)
	t.Cleanup(e.removeCgroups)
	t.Cleanup(e.restoreHost)
	e.recordHost()
	e.addNodeLink()

	e.reg = newRegistry(t)
	web := buildWeb(t, e.path("web"))
	for version, ref := range map[string]*string{"v1": &e.imageV1, "v2": &e.imageV2} {
		m, c, l := webImage(t, web, version)
		*ref, _ = e.reg.push("berth/web:"+version, m, c, l)
	}

	t.Cleanup(e.teardownBerth)
	t.Cleanup(e.stopControlPlane)
	t.Cleanup(e.teardownNode)
	e.startControlPlane()
	e.startBerthd()
	e.startKubelet()
	e.startKubeProxy()
	return e
}

func (e *env) path(elem ...string) string { return filepath.Join(append([]string{e.work}, elem...)...) }
func (e *env) bin(name string) string     { return filepath.Join(e.k8sBin, name) }
func (e *env) berthBin(name string) string {
	return filepath.Join(e.binDir, name)
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// buildWeb compiles test/cluster/web, static, for the test image.
func buildWeb(t *testing.T, out string) []byte {
	t.Helper()
	cmd := exec.Command(envOr("GO", "go"), "build", "-trimpath", "-o", out, "./web")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./web: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkHost refuses a host where the run would collide with what is there:
// a route into the test range, a kubelet, or a kube-proxy's tables.
func checkHost(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ip", "-o", "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("ip route: %v %s", err, out)
	}
	test := netip.MustParsePrefix(testRange)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && slices.Contains([]string{"local", "broadcast", "unicast", "multicast", "anycast",
			"unreachable", "blackhole", "prohibit", "throw"}, f[0]) {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		p, err := netip.ParsePrefix(f[0])
		if err != nil {
			if a, err2 := netip.ParseAddr(f[0]); err2 == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				continue
			}
		}
		if p.Bits() > 0 && p.Overlaps(test) {
			t.Fatalf("the host routes %s, inside the tier's range %s: %s", p, testRange, line)
		}
	}
	if conn, err := net.Dial("unix", devicePluginSocket); err == nil {
		conn.Close()
		t.Fatalf("a kubelet already serves %s on this host: the tier needs a host without one", devicePluginSocket)
	}
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
			t.Fatalf("nftables table %s kube-proxy exists: a kube-proxy runs on this host", family)
		}
	}
}

// recordHost notes the sysctls and host folders the run may change.
func (e *env) recordHost() {
	e.sysctls = map[string]string{}
	for _, s := range hostSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			e.sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	for _, d := range hostPaths {
		if _, err := os.Lstat(d); errors.Is(err, fs.ErrNotExist) {
			e.hostDirs = append(e.hostDirs, d)
		}
	}
}

// addNodeLink makes the link that holds the node's address, and routes
// the whole test range to it: an address of the range no pod or Service
// holds goes nowhere, never out of the host.
func (e *env) addNodeLink() {
	t := e.t
	t.Helper()
	link := fmt.Sprintf("bcn%d", os.Getpid()%100000)
	for i, args := range [][]string{
		{"link", "add", link, "type", "bridge"},
		{"addr", "add", nodeIP + "/32", "dev", link},
		{"link", "set", link, "up"},
		{"route", "add", testRange, "dev", link},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
		}
		if i == 0 {
			e.link = link
		}
	}
}

// restoreHost removes the node link, kube-proxy's tables, the kubelet's host
// files, and sets back the sysctls that changed.
func (e *env) restoreHost() {
	t := e.t
	if e.link != "" {
		if out, err := exec.Command("ip", "link", "del", e.link).CombinedOutput(); err != nil {
			t.Errorf("teardown: ip link del %s: %v %s", e.link, err, out)
		}
	}
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
			if out, err := exec.Command("nft", "delete", "table", family, "kube-proxy").CombinedOutput(); err != nil {
				t.Errorf("teardown: nft delete table %s kube-proxy: %v %s", family, err, out)
			}
		}
	}
	if err := os.Remove(devicePluginSocket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("teardown: %v", err)
	}
	links, _ := os.ReadDir("/var/log/containers")
	for _, l := range links {
		p := filepath.Join("/var/log/containers", l.Name())
		if dst, err := os.Readlink(p); err == nil && strings.HasPrefix(dst, e.work+"/") {
			t.Errorf("teardown: the kubelet left %s -> %s", p, dst)
			os.Remove(p)
		}
	}
	for i := len(e.hostDirs) - 1; i >= 0; i-- { // deepest first
		if err := os.RemoveAll(e.hostDirs[i]); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}
	for s, v := range e.sysctls {
		b, _ := os.ReadFile("/proc/sys/" + s)
		if strings.TrimSpace(string(b)) != v {
			if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
				t.Errorf("teardown: restore %s=%s: %v", s, v, err)
			}
		}
	}
}

// ---- processes ----

// proc is a daemon the test started; it is only ever signalled by its PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, name, logPath string, argv ...string) *proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A daemon must not outlive a test binary that crashed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends sig and waits up to timeout, then SIGKILLs. It reports whether
// the process exited from sig within timeout.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) bool {
	if p == nil || !p.running() {
		return true
	}
	_ = syscall.Kill(p.pid(), sig)
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		_ = syscall.Kill(p.pid(), syscall.SIGKILL)
		<-p.done
		return false
	}
}

// tail is the end of the process's log, for failure messages, without
// berthd's debug lines of successful CRI calls.
func (p *proc) tail(lines int) string {
	b, _ := os.ReadFile(p.log)
	all := slices.DeleteFunc(strings.Split(strings.TrimRight(string(b), "\n"), "\n"), func(l string) bool {
		return strings.Contains(l, `level=DEBUG msg="cri call"`) && strings.HasSuffix(l, "code=OK")
	})
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// waitUp polls ready until it holds, failing when p exits or after timeout.
func waitUp(t *testing.T, p *proc, timeout time.Duration, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if !p.running() {
			t.Fatalf("%s exited during start:\n%s", p.name, p.tail(60))
		}
		err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within %s: %v\n%s", p.name, timeout, err, p.tail(60))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// freePort returns a loopback TCP port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// get returns the body of a 200 answer.
func get(url string) (string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return b.String(), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b.String(), err
}

// ---- control plane ----

// startControlPlane makes the certificates, then starts etcd, the API
// server, the controller-manager and the scheduler, each waited for.
func (e *env) startControlPlane() {
	t := e.t
	t.Helper()
	e.pki = newPKI(t, e.path("pki"))
	p := e.pki
	e.apiPort = freePort(t)
	server := fmt.Sprintf("https://%s:%d", nodeIP, e.apiPort)
	apiCert := p.issue(t, "apiserver", "kube-apiserver", nil, nodeIP, apiService, "127.0.0.1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	apiKubeletClient := p.issue(t, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"})
	saPub, saKey := p.serviceAccountKey(t)
	e.admin = p.kubeconfig(t, "admin", server, p.issue(t, "admin", "berth-admin", []string{"system:masters"}))
	cmConfig := p.kubeconfig(t, "controller-manager", server, p.issue(t, "controller-manager", "system:kube-controller-manager", nil))
	schedConfig := p.kubeconfig(t, "scheduler", server, p.issue(t, "scheduler", "system:kube-scheduler", nil))

	clientPort, peerPort := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	// Plain HTTP on loopback: only the API server talks to it. No fsync: the
	// store dies with the run.
	e.etcd = startProc(t, "etcd", e.path("etcd.log"), e.bin("etcd"),
		"--name", "berth", "--data-dir", e.path("etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "berth="+peerURL, "--unsafe-no-fsync", "--log-level", "warn")
	waitUp(t, e.etcd, time.Minute, func() error {
		body, err := get(etcdURL + "/health")
		if err == nil && !strings.Contains(body, `"health":"true"`) {
			err = fmt.Errorf("health %s", body)
		}
		return err
	})

	e.apiserver = startProc(t, "kube-apiserver", e.path("kube-apiserver.log"), e.bin("kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", nodeIP, "--advertise-address", nodeIP, "--secure-port", fmt.Sprint(e.apiPort),
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--client-ca-file", p.caFile,
		"--tls-cert-file", apiCert.cert, "--tls-private-key-file", apiCert.key,
		"--kubelet-client-certificate", apiKubeletClient.cert, "--kubelet-client-key", apiKubeletClient.key,
		"--kubelet-certificate-authority", p.caFile, "--kubelet-preferred-address-types", "InternalIP",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", serviceCIDR,
		"--cert-dir", e.path("apiserver-certs"))
	waitUp(t, e.apiserver, 2*time.Minute, func() error {
		_, err := e.kubectlErr("get", "--raw", "/readyz")
		return err
	})

	e.controllers = startProc(t, "kube-controller-manager", e.path("kube-controller-manager.log"), e.bin("kube-controller-manager"),
		"--kubeconfig", cmConfig, "--authentication-kubeconfig", cmConfig, "--authorization-kubeconfig", cmConfig,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(freePort(t)), "--leader-elect=false",
		"--allocate-node-cidrs", "--cluster-cidr", clusterCIDR, "--node-cidr-mask-size", "24",
		"--service-cluster-ip-range", serviceCIDR, "--configure-cloud-routes=false",
		"--service-account-private-key-file", saKey, "--root-ca-file", p.caFile, "--use-service-account-credentials",
		"--cluster-signing-cert-file", p.caFile, "--cluster-signing-key-file", filepath.Join(p.dir, "ca.key"),
		"--cert-dir", e.path("controller-manager-certs"))
	e.scheduler = startProc(t, "kube-scheduler", e.path("kube-scheduler.log"), e.bin("kube-scheduler"),
		"--kubeconfig", schedConfig, "--authentication-kubeconfig", schedConfig, "--authorization-kubeconfig", schedConfig,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(freePort(t)), "--leader-elect=false",
		"--cert-dir", e.path("scheduler-certs"))
	// The default service account is the controller-manager's work: pods
	// cannot be admitted before it exists.
	waitUp(t, e.controllers, 2*time.Minute, func() error {
		_, err := e.kubectlErr("get", "serviceaccount", "default", "-n", "default")
		return err
	})
	if !e.scheduler.running() {
		t.Fatalf("kube-scheduler exited:\n%s", e.scheduler.tail(60))
	}
}

func (e *env) stopControlPlane() {
	for _, p := range []*proc{e.scheduler, e.controllers, e.apiserver, e.etcd} {
		if p == nil {
			continue
		}
		if !p.stop(syscall.SIGTERM, 30*time.Second) {
			e.t.Errorf("teardown: %s did not stop within 30s of SIGTERM (killed)", p.name)
		}
		if e.t.Failed() {
			e.t.Logf("%s log (last 40 lines):\n%s", p.name, p.tail(40))
		}
	}
}

// ---- berthd ----

func (e *env) startBerthd() {
	t := e.t
	t.Helper()
	e.root, e.state = e.path("berth-root"), e.path("berth-state")
	e.socket = filepath.Join(e.state, "berth.sock")
	// A bridge and nftables table of this run's own; no subnet, so that the
	// node's pod CIDR the kubelet passes on is the one pods get; no
	// masquerade: every packet of the tier stays on this host.
	e.bridge = fmt.Sprintf("bc%d", os.Getpid()%100000)
	cfg := fmt.Sprintf("[network]\nbridge = %q\nmasquerade = false\n\n[registry.%q]\nplain_http = true\n", e.bridge, e.reg.host)
	cfgPath := e.path("berthd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	e.berthArg = []string{e.berthBin("berthd"), "--config", cfgPath, "--root", e.root,
		"--state", e.state, "--socket", e.socket, "--log-level", "debug"}
	e.launchBerthd()
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.conn = conn
	e.rt = runtimeapi.NewRuntimeServiceClient(conn)
}

// launchBerthd starts berthd with the run's arguments and waits until its
// socket answers Version.
func (e *env) launchBerthd() {
	t := e.t
	t.Helper()
	e.berthd = startProc(t, "berthd", e.path("berthd.log"), e.berthArg...)
	waitUp(t, e.berthd, 30*time.Second, func() error {
		conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
		return err
	})
}

// teardownBerth removes what berth still holds (the kubelet should have
// removed it all: anything left is reported), stops berthd and removes its
// bridge and nftables table.
func (e *env) teardownBerth() {
	t := e.t
	if e.berthd == nil {
		return
	}
	if e.berthd.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if pods, err := e.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range pods.Items {
				t.Errorf("teardown: berth still holds pod %s (%s/%s)", p.Id, p.Metadata.GetNamespace(), p.Metadata.GetName())
				if _, err := e.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
					t.Errorf("teardown: remove pod %s: %v", p.Id, err)
				}
			}
		} else {
			t.Errorf("teardown: list pods: %v", err)
		}
		cancel()
		if !e.berthd.stop(syscall.SIGTERM, 20*time.Second) {
			t.Errorf("berthd did not stop within 20s of SIGTERM (killed)")
		}
	}
	if e.conn != nil {
		e.conn.Close()
	}
	// Shims of pods berth failed to remove: report, then stop them.
	for _, pid := range processesWithArg(e.work) {
		t.Errorf("teardown: process %d still runs from %s: %s (killed)", pid, e.work, cmdline(pid))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if out, err := exec.Command("ip", "link", "del", e.bridge).CombinedOutput(); err != nil && !bytes.Contains(out, []byte("Cannot find device")) {
		t.Errorf("teardown: ip link del %s: %v %s", e.bridge, err, out)
	}
	for _, family := range []string{"ip", "bridge"} {
		if out, err := exec.Command("nft", "delete", "table", family, e.bridge).CombinedOutput(); err != nil && !bytes.Contains(out, []byte("No such file")) {
			t.Errorf("teardown: nft delete table %s %s: %v %s", family, e.bridge, err, out)
		}
	}
	if t.Failed() {
		t.Logf("berthd log (last 100 lines of %s):\n%s", e.berthd.log, e.berthd.tail(100))
	}
}

// ---- the node: kubelet and kube-proxy ----

func (e *env) startKubelet() {
	t := e.t
	t.Helper()
	e.kubeletRoot = e.path("kubelet")
	mkdirs(t, e.kubeletRoot, e.path("pod-logs"))
	e.cgroupRoot = fmt.Sprintf("/berth-cluster-%d", os.Getpid())
	e.makeCgroupRoot()
	resolv := e.path("resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\noptions ndots:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("https://%s:%d", nodeIP, e.apiPort)
	kubeconfig := e.pki.kubeconfig(t, "kubelet", server, e.pki.issue(t, "kubelet", "system:node:"+nodeName, []string{"system:nodes"}))
	serving := e.pki.issue(t, "kubelet-serving", "system:node:"+nodeName, []string{"system:nodes"}, nodeIP, nodeName)
	e.healthz = freePort(t)
	config := fmt.Sprintf(kubeletConfig, nodeIP, freePort(t), e.healthz, serving.cert, serving.key, e.pki.caFile,
		e.cgroupRoot, e.path("pod-logs"), e.path("volume-plugins"), resolv, "unix://"+e.socket)
	configPath := e.path("kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	e.kubeletArg = []string{e.bin("kubelet"), "--config", configPath, "--kubeconfig", kubeconfig,
		"--root-dir", e.kubeletRoot, "--cert-dir", filepath.Join(e.kubeletRoot, "pki"),
		"--hostname-override", nodeName, "--node-ip", nodeIP, "--v", "2"}
	e.launchKubelet()
	e.waitNodeReady(t, 2*time.Minute)
}

// kubeletConfig is the node's KubeletConfiguration; the run fills in its
// addresses, ports, certificates and folders.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: %s
enforceNodeAllocatable: ["pods"]
failCgroupV1: false
podLogsDir: %s
volumePluginDir: %s
resolvConf: %s
containerRuntimeEndpoint: %s
clusterDomain: cluster.local
# Test hosts have swap or not, little free disk maybe, and share the machine:
# never evict a test pod and never garbage-collect the test images.
failSwapOn: false
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
  imagefs.inodesFree: "1%%"
mergeDefaultEvictionSettings: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Leave the host alone: no iptables chains, no oom_score_adj for itself; the
# kernel settings it still sets are restored by the test.
makeIPTablesUtilChains: false
protectKernelDefaults: false
oomScoreAdj: 0
syncFrequency: 10s
nodeStatusUpdateFrequency: 10s
containerLogMaxSize: 10Mi
containerLogMaxFiles: 3
# Pod and container stats from berth (ListPodSandboxStats): without it the
# kubelet reads pod network stats from cAdvisor, for a pause container's
# cgroup, which berth does not have, and /stats/summary has none.
featureGates:
  PodAndContainerStatsFromCRI: true
`

func (e *env) launchKubelet() {
	t := e.t
	t.Helper()
	e.kubelet = startProc(t, "kubelet", e.path("kubelet.log"), e.kubeletArg...)
	waitUp(t, e.kubelet, 90*time.Second, func() error {
		body, err := get(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.healthz))
		if err == nil && body != "ok" {
			err = fmt.Errorf("healthz %q", body)
		}
		return err
	})
}

// startKubeProxy runs kube-proxy in nftables mode. Its conntrack settings
// are zero: it leaves the host's conntrack table sizes and timeouts alone.
func (e *env) startKubeProxy() {
	t := e.t
	t.Helper()
	server := fmt.Sprintf("https://%s:%d", nodeIP, e.apiPort)
	kubeconfig := e.pki.kubeconfig(t, "kube-proxy", server, e.pki.issue(t, "kube-proxy", "system:kube-proxy", nil))
	healthz := freePort(t)
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, kubeconfig, nodeName, clusterCIDR, healthz, freePort(t))
	configPath := e.path("kube-proxy.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	e.kubeProxy = startProc(t, "kube-proxy", e.path("kube-proxy.log"), e.bin("kube-proxy"), "--config", configPath, "--v", "2")
	waitUp(t, e.kubeProxy, time.Minute, func() error {
		if _, err := get(fmt.Sprintf("http://127.0.0.1:%d/healthz", healthz)); err != nil {
			return err
		}
		return exec.Command("nft", "list", "table", "ip", "kube-proxy").Run()
	})
}

// teardownNode deletes every object the tests made, so that the kubelet
// takes their pods down through berth the way a node does, then stops
// kube-proxy and the kubelet.
func (e *env) teardownNode() {
	t := e.t
	if e.kubelet != nil && e.kubelet.running() && e.apiserver != nil && e.apiserver.running() {
		if out, err := e.kubectlErr("delete", "namespace", "-l", testLabel, "--wait=false"); err != nil {
			t.Errorf("teardown: %v %s", err, out)
		}
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			if n, err := e.berthPodCount(); err == nil && n == 0 {
				break
			}
			time.Sleep(2 * time.Second)
		}
	}
	for _, p := range []*proc{e.kubeProxy, e.kubelet} {
		if !p.stop(syscall.SIGTERM, 30*time.Second) {
			t.Errorf("teardown: %s did not stop within 30s of SIGTERM (killed)", p.name)
		}
		if p != nil && t.Failed() {
			t.Logf("%s log (last 100 lines):\n%s", p.name, p.tail(100))
		}
	}
}

func (e *env) berthPodCount() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := e.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, err
	}
	return len(r.Items), nil
}
