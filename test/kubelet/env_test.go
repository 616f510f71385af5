package kubelet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// guardEnv must be "1" (and the test run as root) for the tier to run.
const guardEnv = "BERTH_KUBELET"

// nodeName is the kubelet's --hostname-override: static pods are named
// "<manifest name>-<node name>".
const nodeName = "berth-e2e"

// kubeletSysctls are the kernel settings the kubelet's container manager
// changes at start (protectKernelDefaults: false); they are restored at the end.
var kubeletSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
	"kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// env is one run of the tier: a loopback registry, berthd and a standalone
// kubelet on folders of their own under work.
type env struct {
	t    *testing.T
	work string // everything the run creates on disk lives below

	berthBin   string // folder with berthd, berth-shim, berth-pause, berthctl (make build)
	kubeletBin string // the kubelet (make test-kubelet builds bin/kubelet)
	configFile string // the KubeletConfiguration kept in the repository
	// kubeletExtra is added to the run's KubeletConfiguration drop-in.
	kubeletExtra string

	reg      *registry
	image    string // 127.0.0.1:PORT/berth/busybox:e2e
	imageID  string // its config digest
	bridge   string
	subnet   string
	berthd   *proc
	berthArg []string
	root     string // berthd --root
	state    string // berthd --state
	socket   string
	conn     *grpc.ClientConn
	rt       runtimeapi.RuntimeServiceClient
	img      runtimeapi.ImageServiceClient

	kubelet     *proc
	kubeletRoot string
	manifests   string // staticPodPath
	podLogs     string // podLogsDir
	cgroupRoot  string // the kubelet's cgroupRoot, "/berth-kubelet-PID"
	port        int    // the kubelet's API (HTTPS): exec, attach, port-forward
	readOnly    int    // readOnlyPort: /pods
	healthz     int    // healthzPort: /healthz
	sysctls     map[string]string
	hierarchies []string // cgroup mount points the cgroup root was made in
	hostDirs    []string // kubeletHostPaths that were missing at start
}

// kubeletHostPaths are written by the kubelet whatever its flags say: the
// device plugin socket's folder and /var/log/containers (its symlinks to
// the pod logs). The test removes those of them it finds missing at start.
var kubeletHostPaths = []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins", "/var/log/containers"}

// devicePluginSocket is the kubelet's, at a fixed path.
const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// repoRoot is berth's repository (this module lives in test/kubelet).
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
		t.Skipf("set %s=1 (root) to run the kubelet end-to-end tier (make test-kubelet)", guardEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s=1 needs root (euid is %d)", guardEnv, os.Geteuid())
	}
}

// newEnv checks the binaries, then starts the registry, berthd and the
// kubelet. Everything is stopped and removed by cleanups registered here.
// newEnv starts berthd and a kubelet on it; kubeletExtra is added to the
// kubelet's configuration (YAML keys of a KubeletConfiguration).
func newEnv(t *testing.T, kubeletExtra string) *env {
	t.Helper()
	repo := repoRoot(t)
	e := &env{t: t, kubeletExtra: kubeletExtra,
		berthBin:   envOr("BERTH_BIN_DIR", filepath.Join(repo, "bin")),
		kubeletBin: envOr("KUBELET", filepath.Join(repo, "bin", "kubelet")),
		configFile: filepath.Join(repo, "test", "kubelet", "kubelet-config.yaml"),
	}
	for _, p := range []string{filepath.Join(e.berthBin, "berthd"), filepath.Join(e.berthBin, "berth-shim"), filepath.Join(e.berthBin, "berth-pause"), e.kubeletBin} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v: build it with `make test-kubelet` (or set BERTH_BIN_DIR / KUBELET)", err)
		}
	}
	// Short: unix socket paths must stay below 108 bytes.
	work, err := os.MkdirTemp("", "bk-")
	if err != nil {
		t.Fatal(err)
	}
	// Traversable, as /run is for berthd's default state folder: the init of
	// a hostUsers: false container reaches its bundle through it.
	if err := os.Chmod(work, 0o711); err != nil {
		t.Fatal(err)
	}
	e.work = work
	// Cleanups run last first: the kubelet takes its pods down through
	// berth, berth removes what is left, then cgroups and folders go.
	t.Cleanup(e.removeWork)
	t.Cleanup(e.removeCgroups)
	t.Cleanup(e.teardownBerth)
	t.Cleanup(e.teardownKubelet)

	e.reg = newRegistry(t)
	manifest, config, layer := busyboxImage(t)
	e.image, e.imageID = e.reg.push("berth/busybox:e2e", manifest, config, layer)

	e.startBerthd()
	e.startKubelet()
	return e
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func (e *env) path(elem ...string) string { return filepath.Join(append([]string{e.work}, elem...)...) }

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
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
	if !p.running() {
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
// berthd's debug lines of successful CRI calls (the kubelet polls often).
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

// ---- berthd ----

func (e *env) startBerthd() {
	t := e.t
	t.Helper()
	e.root, e.state = e.path("berth-root"), e.path("berth-state")
	e.socket = filepath.Join(e.state, "berth.sock")
	// A bridge, nftables table and subnet of this run's own: other berthd
	// instances (integration tests, a node's berthd) may run at the same time.
	e.bridge = fmt.Sprintf("bk%d", os.Getpid()%100000)
	e.subnet = fmt.Sprintf("10.199.%d.0/24", os.Getpid()%256)
	cfg := fmt.Sprintf("[network]\nbridge = %q\nsubnet = %q\nmasquerade = false\n\n[registry.%q]\nplain_http = true\n",
		e.bridge, e.subnet, e.reg.host)
	cfgPath := e.path("berthd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	e.berthArg = []string{filepath.Join(e.berthBin, "berthd"), "--config", cfgPath, "--root", e.root,
		"--state", e.state, "--socket", e.socket, "--log-level", "debug"}
	e.launchBerthd()
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.conn = conn
	e.rt = runtimeapi.NewRuntimeServiceClient(conn)
	e.img = runtimeapi.NewImageServiceClient(conn)
}

// launchBerthd starts berthd with the run's arguments and waits (30 s at
// most) until its socket answers Version.
func (e *env) launchBerthd() {
	t := e.t
	t.Helper()
	e.berthd = startProc(t, "berthd", e.path("berthd.log"), e.berthArg...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if !e.berthd.running() {
			t.Fatalf("berthd exited during start:\n%s", e.berthd.tail(40))
		}
		if conn, err := net.Dial("unix", e.socket); err == nil {
			conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := e.versionOnce(ctx)
			cancel()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("berthd did not answer on %s within 30s:\n%s", e.socket, e.berthd.tail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// versionOnce asks Version on a connection of its own (the shared client may
// be in reconnect back-off right after a restart).
func (e *env) versionOnce(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
}

// teardownBerth removes what berth still holds (after the kubelet stopped),
// stops berthd and removes its bridge and nftables table.
func (e *env) teardownBerth() {
	t := e.t
	if e.berthd == nil {
		return
	}
	if e.berthd.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if pods, err := e.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range pods.Items {
				if _, err := e.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
					t.Errorf("teardown: remove pod %s (%s): %v", p.Id, p.Metadata.GetName(), err)
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
		t.Logf("teardown: ip link del %s: %v %s", e.bridge, err, out)
	}
	for _, family := range []string{"ip", "bridge"} {
		if out, err := exec.Command("nft", "delete", "table", family, e.bridge).CombinedOutput(); err != nil && !bytes.Contains(out, []byte("No such file")) {
			t.Logf("teardown: nft delete table %s %s: %v %s", family, e.bridge, err, out)
		}
	}
	if t.Failed() {
		t.Logf("berthd log (last 150 lines of %s):\n%s", e.berthd.log, e.berthd.tail(150))
	}
}

// ---- kubelet ----

func (e *env) startKubelet() {
	t := e.t
	t.Helper()
	e.kubeletRoot, e.manifests, e.podLogs = e.path("kubelet"), e.path("manifests"), e.path("pod-logs")
	dropins := e.path("kubelet.conf.d")
	mkdirs(t, e.kubeletRoot, e.manifests, e.podLogs, dropins, e.path("tmp"))
	e.cgroupRoot = fmt.Sprintf("/berth-kubelet-%d", os.Getpid())
	e.makeCgroupRoot()

	resolv := e.path("resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\nsearch berth-e2e.test\noptions ndots:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A kubelet of the host would share the device plugin socket with this one.
	if conn, err := net.Dial("unix", devicePluginSocket); err == nil {
		conn.Close()
		t.Fatalf("a kubelet already serves %s on this host: the tier needs a host without one", devicePluginSocket)
	}
	for _, d := range kubeletHostPaths {
		if _, err := os.Lstat(d); errors.Is(err, fs.ErrNotExist) {
			e.hostDirs = append(e.hostDirs, d)
		}
	}
	e.port, e.readOnly, e.healthz = freePort(t), freePort(t), freePort(t)
	// What differs per run goes into a drop-in; the repository's file holds
	// everything a host like this needs.
	dropin := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %s
podLogsDir: %s
volumePluginDir: %s
cgroupRoot: %s
resolvConf: %s
address: 127.0.0.1
port: %d
readOnlyPort: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
`, e.manifests, e.podLogs, e.path("volume-plugins"), e.cgroupRoot, resolv, e.port, e.readOnly, e.healthz) + e.kubeletExtra
	if err := os.WriteFile(filepath.Join(dropins, "50-run.conf"), []byte(dropin), 0o644); err != nil {
		t.Fatal(err)
	}

	e.sysctls = map[string]string{}
	for _, s := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			e.sysctls[s] = strings.TrimSpace(string(b))
		}
	}

	e.kubelet = startProc(t, "kubelet", e.path("kubelet.log"), e.kubeletBin,
		"--config", e.configFile,
		"--config-dir", dropins,
		"--root-dir", e.kubeletRoot,
		"--cert-dir", filepath.Join(e.kubeletRoot, "pki"),
		"--container-runtime-endpoint", "unix://"+e.socket,
		"--hostname-override", nodeName,
		"--v", "2")
	deadline := time.Now().Add(90 * time.Second)
	for {
		if !e.kubelet.running() {
			t.Fatalf("kubelet exited during start:\n%s", e.kubelet.tail(60))
		}
		if body, err := e.get(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.healthz)); err == nil && body == "ok" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet /healthz not ok within 90s:\n%s", e.kubelet.tail(60))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// teardownKubelet removes every static pod and lets the kubelet take them
// down (so berth removes them the way a node does), stops the kubelet by
// its PID, then removes what it made: cgroups, mounts, folders, and the
// sysctls it changed are set back.
func (e *env) teardownKubelet() {
	t := e.t
	if e.kubelet == nil {
		return
	}
	if e.kubelet.running() {
		ents, _ := os.ReadDir(e.manifests)
		for _, ent := range ents {
			os.Remove(filepath.Join(e.manifests, ent.Name()))
		}
		if len(ents) > 0 {
			// The kubelet stops pods at once, but only its container GC
			// (every minute) removes their sandboxes.
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				if n, err := e.berthPodCount(); err == nil && n == 0 {
					break
				}
				time.Sleep(time.Second)
			}
		}
		if !e.kubelet.stop(syscall.SIGTERM, 30*time.Second) {
			t.Errorf("kubelet did not stop within 30s of SIGTERM (killed)")
		}
	}
	if t.Failed() {
		t.Logf("kubelet log (last 150 lines of %s):\n%s", e.kubelet.log, e.kubelet.tail(150))
	}
	e.removeHostPaths()
	for s, v := range e.sysctls {
		b, _ := os.ReadFile("/proc/sys/" + s)
		if strings.TrimSpace(string(b)) != v {
			if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
				t.Errorf("teardown: restore %s=%s: %v", s, v, err)
			}
		}
	}
}

// removeHostPaths removes the device plugin socket, the kubelet's symlinks
// to this run's pod logs, and the host folders that were not there before.
func (e *env) removeHostPaths() {
	t := e.t
	if err := os.Remove(devicePluginSocket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("teardown: %v", err)
	}
	links, _ := os.ReadDir("/var/log/containers")
	for _, l := range links {
		p := filepath.Join("/var/log/containers", l.Name())
		if dst, err := os.Readlink(p); err == nil && strings.HasPrefix(dst, e.work+"/") {
			t.Logf("teardown: the kubelet left %s -> %s", p, dst)
			os.Remove(p)
		}
	}
	for i := len(e.hostDirs) - 1; i >= 0; i-- { // deepest first
		if err := os.Remove(e.hostDirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("teardown: %v", err)
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

// ---- cgroups ----

// cgroupMounts are the cgroup hierarchies mounted under /sys/fs/cgroup:
// each v1 controller mount (and the hybrid "unified" one), or the one v2 root.
func cgroupMounts(t *testing.T) []string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return []string{"/sys/fs/cgroup"}
	}
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ent := range ents {
		dir := filepath.Join("/sys/fs/cgroup", ent.Name())
		if ent.Type()&fs.ModeSymlink != 0 {
			continue
		}
		if unix.Statfs(dir, &st) == nil && (st.Type == unix.CGROUP_SUPER_MAGIC || st.Type == unix.CGROUP2_SUPER_MAGIC) {
			out = append(out, dir)
		}
	}
	return out
}

// makeCgroupRoot creates the kubelet's cgroupRoot in every hierarchy: the
// kubelet refuses a cgroupRoot that does not exist.
func (e *env) makeCgroupRoot() {
	t := e.t
	t.Helper()
	e.hierarchies = cgroupMounts(t)
	for _, h := range e.hierarchies {
		dir := filepath.Join(h, e.cgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			t.Fatal(err)
		}
		// A new v1 cpuset starts empty: no process could join it.
		if _, err := os.Stat(filepath.Join(dir, "cpuset.cpus")); err == nil && !strings.HasSuffix(h, "unified") {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					t.Fatalf("%s/%s: %v", dir, f, err)
				}
			}
		}
	}
	// Ask the v2 root to hand its controllers down when it is the only hierarchy.
	if len(e.hierarchies) == 1 {
		b, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
		want := strings.Fields(string(b))
		for _, c := range want {
			_ = os.WriteFile(filepath.Join("/sys/fs/cgroup", e.cgroupRoot, "cgroup.subtree_control"), []byte("+"+c), 0o644)
		}
	}
}

// cgroupDirs lists the run's cgroupRoot and every cgroup below it, in every
// hierarchy, deepest first.
func (e *env) cgroupDirs() []string {
	var dirs []string
	for _, h := range e.hierarchies {
		_ = filepath.WalkDir(filepath.Join(h, e.cgroupRoot), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// removeCgroups removes the cgroupRoot tree; a cgroup that still holds a
// process is a leak: it is reported and its processes killed first.
func (e *env) removeCgroups() {
	t := e.t
	for _, dir := range e.cgroupDirs() {
		if procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); len(bytes.TrimSpace(procs)) > 0 {
			t.Errorf("teardown: cgroup %s still holds processes %q (killed)", dir, strings.Fields(string(procs)))
			for _, f := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		for i := 0; i < 50; i++ {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			if i == 49 {
				t.Errorf("teardown: rmdir %s: %v", dir, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// ---- mounts and folders ----

// mountsUnder lists mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mp := unescapeMount(fields[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return slices.Compact(out)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (e *env) removeWork() {
	t := e.t
	for _, m := range mountsUnder(e.work) {
		// Two folders are bind mounts of themselves by design: the kubelet's
		// root dir (made rshared) and berth's pod pin folder (made rprivate).
		if m != e.kubeletRoot && m != filepath.Join(e.state, "pods") {
			t.Errorf("teardown: %s is still mounted (unmounted now)", m)
		}
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("teardown: unmount %s: %v", m, err)
		}
	}
	// BERTH_KUBELET_LOGS names a folder that gets the logs of every run
	// (CI artifacts); without it they are kept only when the test failed.
	keep := os.Getenv("BERTH_KUBELET_LOGS")
	if keep == "" && t.Failed() {
		keep = filepath.Join(os.TempDir(), "berth-kubelet-logs-"+time.Now().Format("20060102-150405"))
	}
	if keep != "" {
		if os.MkdirAll(keep, 0o755) == nil {
			for _, f := range []string{"berthd.log", "kubelet.log"} {
				if b, err := os.ReadFile(e.path(f)); err == nil {
					_ = os.WriteFile(filepath.Join(keep, f), b, 0o644)
				}
			}
			t.Logf("full logs kept in %s", keep)
		}
	}
	if err := os.RemoveAll(e.work); err != nil {
		t.Errorf("teardown: remove %s: %v", e.work, err)
	}
}

// processesWithArg returns live processes with an argument containing substr.
func processesWithArg(substr string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(substr)) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if i := bytes.LastIndexByte(stat, ')'); err != nil || i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		if pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// ---- HTTP ----

var httpClient = &http.Client{Timeout: 5 * time.Second}

// get returns the body of a 200 answer.
func (e *env) get(url string) (string, error) {
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
