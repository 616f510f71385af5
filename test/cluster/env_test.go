package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// guardEnv must be "1" (and the test run as root) for the tier to run.
const guardEnv = "BERTH_CLUSTER"

// The cluster's addresses, all in 172.29.0.0/16 (which the tier checks no
// route of the host touches): the control plane's, on a link the test makes
// on the host (a bridge without ports, which every kernel that runs berth
// has, unlike the dummy driver), to which each node's veth is joined; the
// pod range the controller-manager cuts each node's /24 from, and the
// service range.
const (
	hostIP      = "172.29.255.1"
	clusterCIDR = "172.29.0.0/17"
	serviceCIDR = "172.29.128.0/24"
	apiService  = "172.29.128.1" // the kubernetes Service, first of serviceCIDR
	testRange   = "172.29.0.0/16"
)

// The cluster is dual-stack, IPv4 first: its IPv6 half is in the ULA range
// fd29:29::/32 (which the tier checks no route of the host touches, as for
// testRange): the control plane's IPv6 address on the same link, the pod
// range the controller-manager cuts each node's /64 from, and the IPv6
// service range.
const (
	hostIP6      = "fd29:29:ff::1"
	clusterCIDR6 = "fd29:29::/56"
	serviceCIDR6 = "fd29:29:1::/112"
	testRange6   = "fd29:29::/32"
)

// hostSysctls are the kernel settings the kubelet (protectKernelDefaults:
// false), kube-proxy and berth's network may change; they are restored at
// the end.
var hostSysctls = append(slices.Clone(kubeenv.KubeletSysctls),
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet", "net/netfilter/nf_conntrack_max",
	"net/ipv6/conf/all/forwarding")

// env is one run of the tier: a loopback registry, etcd and the control
// plane on the host, on folders of this run under work, and the nodes.
type env struct {
	t      *testing.T
	work   *kubeenv.Work // everything the run creates on disk lives below
	binDir string        // berthd, berth-shim (make build)
	k8sBin string        // etcd and the Kubernetes binaries (make test-cluster)

	reg     *kubeenv.Registry
	imageV1 string // 127.0.0.1:PORT/berth/web:v1
	imageV2 string // the same with /etc/web-version "v2"
	pki     *pki
	admin   string // the admin's kubeconfig (system:masters)
	link    string // the portless bridge holding hostIP, the nodes' veths on it
	host    *kubeenv.Host

	etcd, apiserver, controllers, scheduler *kubeenv.Proc
	apiPort                                 int

	nodes []*node // both schedulable, in namespaces of their own (node_test.go)
	// vm is the VM node (vmnode_test.go): TestCluster's, not the e2e
	// tier's; nil without it.
	vm     *vmNode
	withVM bool

	hostPort, hostNetPort int // of the hostport and hostnet pods
}

func requireTier(t *testing.T) { kubeenv.Require(t, guardEnv, "test-cluster") }

// newEnv checks the host and the binaries, then starts everything; each part
// is stopped and removed by cleanups registered here, in reverse order.
// With withVM the VM node boots beside the control plane and the netns
// nodes (vmnode_test.go); its steps wait for it.
func newEnv(t *testing.T, withVM bool) *env {
	t.Helper()
	repo := kubeenv.RepoRoot(t)
	e := &env{t: t, withVM: withVM,
		binDir: kubeenv.EnvOr("BERTH_BIN_DIR", filepath.Join(repo, "bin")),
		k8sBin: kubeenv.EnvOr("CLUSTER_BIN_DIR", filepath.Join(repo, "bin", "cluster")),
	}
	kubeenv.NeedFiles(t, "`make test-cluster` (or set BERTH_BIN_DIR / CLUSTER_BIN_DIR)",
		e.berthBin("berthd"), e.berthBin("berth-shim"), e.bin("etcd"), e.bin("kube-apiserver"),
		e.bin("kube-controller-manager"), e.bin("kube-scheduler"), e.bin("kubelet"), e.bin("kube-proxy"), e.bin("kubectl"))
	checkHost(t)
	e.work = kubeenv.NewWork(t, "bc-", "BERTH_CLUSTER_LOGS")
	t.Cleanup(func() { e.work.Remove(t) })
	t.Cleanup(e.restoreHost)
	e.host = kubeenv.RecordHost(t, hostSysctls)
	e.addNodeLink()

	e.reg = kubeenv.NewRegistry(t)
	web := buildWeb(t, e.path("web"))
	for version, ref := range map[string]*string{"v1": &e.imageV1, "v2": &e.imageV2} {
		*ref, _ = e.reg.PushBusybox(t, "berth/web:"+version, kubeenv.File{Name: "bin/web", Mode: 0o755, Data: web},
			kubeenv.File{Name: "etc/web-version", Mode: 0o644, Data: []byte(version + "\n")})
	}

	t.Cleanup(e.stopControlPlane)
	e.startControlPlane()
	e.startNodes()
	return e
}

func (e *env) path(elem ...string) string { return e.work.Path(elem...) }
func (e *env) bin(name string) string     { return filepath.Join(e.k8sBin, name) }
func (e *env) berthBin(name string) string {
	return filepath.Join(e.binDir, name)
}

// buildWeb compiles test/cluster/web, static, for the test image.
func buildWeb(t *testing.T, out string) []byte {
	t.Helper()
	cmd := exec.Command(kubeenv.EnvOr("GO", "go"), "build", "-trimpath", "-o", out, "./web")
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

// ---- control plane ----

// startControlPlane makes the certificates, then starts etcd, the API
// server, the controller-manager and the scheduler, each waited for.
func (e *env) startControlPlane() {
	t := e.t
	t.Helper()
	e.pki = newPKI(t, e.path("pki"))
	p := e.pki
	e.apiPort = kubeenv.FreePort(t)
	server := fmt.Sprintf("https://%s:%d", hostIP, e.apiPort)
	apiCert := p.issue(t, "apiserver", "kube-apiserver", nil, hostIP, apiService, "127.0.0.1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	apiKubeletClient := p.issue(t, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"})
	saPub, saKey := p.serviceAccountKey(t)
	e.admin = p.kubeconfig(t, "admin", server, p.issue(t, "admin", "berth-admin", []string{"system:masters"}))
	cmConfig := p.kubeconfig(t, "controller-manager", server, p.issue(t, "controller-manager", "system:kube-controller-manager", nil))
	schedConfig := p.kubeconfig(t, "scheduler", server, p.issue(t, "scheduler", "system:kube-scheduler", nil))
	if e.withVM {
		e.startVMNode(server)
	}

	clientPort, peerPort := kubeenv.FreePort(t), kubeenv.FreePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	// Plain HTTP on loopback: only the API server talks to it. No fsync: the
	// store dies with the run.
	e.etcd = kubeenv.Start(t, "etcd", e.path("etcd.log"), e.bin("etcd"),
		"--name", "berth", "--data-dir", e.path("etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "berth="+peerURL, "--unsafe-no-fsync", "--log-level", "warn")
	e.etcd.WaitUp(t, time.Minute, func() error {
		body, err := kubeenv.Get(etcdURL + "/health")
		if err == nil && !strings.Contains(body, `"health":"true"`) {
			err = fmt.Errorf("health %s", body)
		}
		return err
	})

	e.apiserver = kubeenv.Start(t, "kube-apiserver", e.path("kube-apiserver.log"), e.bin("kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", hostIP, "--advertise-address", hostIP, "--secure-port", fmt.Sprint(e.apiPort),
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--client-ca-file", p.caFile,
		"--tls-cert-file", apiCert.cert, "--tls-private-key-file", apiCert.key,
		"--kubelet-client-certificate", apiKubeletClient.cert, "--kubelet-client-key", apiKubeletClient.key,
		"--kubelet-certificate-authority", p.caFile, "--kubelet-preferred-address-types", "InternalIP",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", serviceCIDR+","+serviceCIDR6,
		"--cert-dir", e.path("apiserver-certs"),
		// Privileged containers, which e2e specs run (make test-e2e).
		"--allow-privileged",
		// lifecycle.stopSignal (alpha in 1.37); the kubelet's gate is in kubeletConfig.
		"--feature-gates", "ContainerStopSignals=true")
	e.apiserver.WaitUp(t, 2*time.Minute, func() error {
		_, err := e.kubectlErr("get", "--raw", "/readyz")
		return err
	})

	e.controllers = kubeenv.Start(t, "kube-controller-manager", e.path("kube-controller-manager.log"), e.bin("kube-controller-manager"),
		"--kubeconfig", cmConfig, "--authentication-kubeconfig", cmConfig, "--authorization-kubeconfig", cmConfig,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(kubeenv.FreePort(t)), "--leader-elect=false",
		"--allocate-node-cidrs", "--cluster-cidr", clusterCIDR+","+clusterCIDR6,
		"--node-cidr-mask-size-ipv4", "24", "--node-cidr-mask-size-ipv6", "64",
		"--service-cluster-ip-range", serviceCIDR+","+serviceCIDR6, "--configure-cloud-routes=false",
		"--service-account-private-key-file", saKey, "--root-ca-file", p.caFile, "--use-service-account-credentials",
		"--cluster-signing-cert-file", p.caFile, "--cluster-signing-key-file", filepath.Join(p.dir, "ca.key"),
		"--cert-dir", e.path("controller-manager-certs"))
	e.scheduler = kubeenv.Start(t, "kube-scheduler", e.path("kube-scheduler.log"), e.bin("kube-scheduler"),
		"--kubeconfig", schedConfig, "--authentication-kubeconfig", schedConfig, "--authorization-kubeconfig", schedConfig,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(kubeenv.FreePort(t)), "--leader-elect=false",
		"--cert-dir", e.path("scheduler-certs"))
	// The default service account is the controller-manager's work: pods
	// cannot be admitted before it exists.
	e.controllers.WaitUp(t, 2*time.Minute, func() error {
		_, err := e.kubectlErr("get", "serviceaccount", "default", "-n", "default")
		return err
	})
	if !e.scheduler.Running() {
		t.Fatalf("kube-scheduler exited:\n%s", e.scheduler.Tail(60))
	}
}

func (e *env) stopControlPlane() {
	for _, p := range []*kubeenv.Proc{e.scheduler, e.controllers, e.apiserver, e.etcd} {
		if p == nil {
			continue
		}
		if !p.Stop(syscall.SIGTERM, 30*time.Second) {
			e.t.Errorf("teardown: %s did not stop within 30s of SIGTERM (killed)", p.Name)
		}
		if e.t.Failed() {
			e.t.Logf("%s log (last 40 lines):\n%s", p.Name, p.Tail(40))
		}
	}
}

// ---- the nodes: berthd, kubelet and kube-proxy (node_test.go) ----

// answersVersion is nil once berthd's socket answers the CRI's Version.
func answersVersion(socket string) func() error {
	return func() error {
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
		return err
	}
}

// kubeletArgs writes the configuration of a node's kubelet below w (its
// root folder w/kubelet) and returns its command line and healthz port.
// The node's addresses are ip and ip6, IPv4 first (the cluster is
// dual-stack); the kubelet and its healthz listen on ip.
func (e *env) kubeletArgs(t *testing.T, w *kubeenv.Work, name, ip, ip6 string, cgroups *kubeenv.Cgroups, socket string) ([]string, int) {
	t.Helper()
	root := w.Path("kubelet")
	kubeenv.Mkdirs(t, root, w.Path("pod-logs"))
	resolv := w.Path("resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\noptions ndots:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("https://%s:%d", hostIP, e.apiPort)
	kubeconfig := e.pki.kubeconfig(t, "kubelet-"+name, server, e.pki.issue(t, "kubelet-"+name, "system:node:"+name, []string{"system:nodes"}))
	serving := e.pki.issue(t, "kubelet-serving-"+name, "system:node:"+name, []string{"system:nodes"}, ip, ip6, name)
	healthz := kubeenv.FreePort(t)
	config := fmt.Sprintf(kubeletConfig, ip, kubeletPort, ip, healthz, serving.cert, serving.key, e.pki.caFile,
		cgroups.Root, w.Path("pod-logs"), w.Path("volume-plugins"), resolv, "unix://"+socket, kubeletNoEviction)
	configPath := w.Path("kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{e.bin("kubelet"), "--config", configPath, "--kubeconfig", kubeconfig,
		"--root-dir", root, "--cert-dir", filepath.Join(root, "pki"),
		"--hostname-override", name, "--node-ip", ip + "," + ip6, "--v", "2"}, healthz
}

// kubeletPort is the kubelet's API port: the usual one, as each node has a
// network namespace of its own, and the e2e framework assumes it (its
// failure dumps ask each node's kubelet for its pods there).
const kubeletPort = 10250

// kubeletNoEviction keeps the kubelet from evicting a test pod or
// collecting a test image on a test machine (or VM) of little free disk.
const kubeletNoEviction = `evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
  imagefs.inodesFree: "1%"
mergeDefaultEvictionSettings: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`

// kubeletConfig is the node's KubeletConfiguration; the run fills in its
// addresses, ports, certificates and folders.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: %s
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
%sserializeImagePulls: false
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
  # lifecycle.stopSignal to berth and ContainerStatus.stop_signal back (alpha in 1.37).
  ContainerStopSignals: true
`

// kubeProxyConfig writes the configuration of a node's kube-proxy below w
// and returns its path and healthz port (on listenIP): nftables mode (both
// families: the cluster is dual-stack), and conntrack settings zero, so
// that it leaves the host's conntrack table sizes and timeouts alone.
func (e *env) kubeProxyConfig(t *testing.T, w *kubeenv.Work, name, listenIP string) (string, int) {
	t.Helper()
	server := fmt.Sprintf("https://%s:%d", hostIP, e.apiPort)
	kubeconfig := e.pki.kubeconfig(t, "kube-proxy-"+name, server, e.pki.issue(t, "kube-proxy-"+name, "system:kube-proxy", nil))
	healthz := kubeenv.FreePort(t)
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: %s
metricsBindAddress: %s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, kubeconfig, name, clusterCIDR+","+clusterCIDR6, net.JoinHostPort(listenIP, fmt.Sprint(healthz)), net.JoinHostPort(listenIP, fmt.Sprint(kubeenv.FreePort(t))))
	path := w.Path("kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, healthz
}
