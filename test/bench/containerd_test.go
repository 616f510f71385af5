package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cniBinDir is where Debian's containernetworking-plugins installs them.
const cniBinDir = "/usr/lib/cni"

// containerdConfig is a containerd 1.6 configuration on private folders: its
// CRI plugin pulls from the bench's loopback registry over plain HTTP, uses
// the bench's pause image (there is no outside registry), runc through the
// runc v2 shim with the cgroupfs driver, and the CNI bridge + portmap
// plugins, as the comparison in the issue was measured. Its snapshotter is
// overlayfs, or the stargz snapshotter (stargzPlugin), which needs the
// layers' annotations (the eStargz TOC digest) passed on to it.
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # As berth's tests on this kind of host: no CAP_SYS_RESOURCE to lower the
  # pause's oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = %[9]q
    disable_snapshot_annotations = %[10]t
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors.%[8]q]
    endpoint = ["http://%[8]s"]
`

// cniConfig is the bridge network containerd's pods get: a bridge and a
// subnet of their own, host-local addresses kept in the run's folder.
const cniConfig = `{"cniVersion": "1.0.0", "name": "bench", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q, "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
`

// containerdSetup is what startContainerd runs containerd with.
type containerdSetup struct {
	registryHost string // pulled from over plain HTTP
	pauseImage   string
	// The CNI bridge's name and subnet.
	bridge, subnet string
	// stargz runs containerd-stargz-grpc (startStargz) beside containerd,
	// as its CRI plugin's snapshotter.
	stargz bool
}

// containerd is one containerd started by startContainerd.
type containerd struct {
	cmd    *exec.Cmd
	root   string // containerd's root folder
	socket string
	conn   *grpc.ClientConn
}

// startContainerd runs Debian's containerd on fresh folders as set up, and
// waits until its CRI answers. It is stopped, and its bridge and folders
// removed, when the test ends (before the stargz snapshotter).
func startContainerd(t *testing.T, setup containerdSetup) *containerd {
	t.Helper()
	if _, err := exec.LookPath("containerd"); err != nil {
		t.Fatal("containerd is not installed: run `make bench-compare`, which installs Debian's containerd and runc")
	}
	dir, err := os.MkdirTemp("", "bench-ctd-") // short: shim socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	cniDir := filepath.Join(dir, "cni")
	if err := os.MkdirAll(cniDir, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(cniConfig, setup.bridge, setup.subnet, filepath.Join(dir, "ipam"))
	if err := os.WriteFile(filepath.Join(cniDir, "10-bench.conflist"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &containerd{root: filepath.Join(dir, "root"), socket: filepath.Join(dir, "containerd.sock")}
	snapshotter := "overlayfs"
	var plugins string
	if setup.stargz {
		snapshotter = "stargz"
		plugins = fmt.Sprintf(stargzPlugin, startStargz(t, setup.registryHost))
	}
	cfg := fmt.Sprintf(containerdConfig, c.root, filepath.Join(dir, "state"), c.socket,
		filepath.Join(dir, "opt"), setup.pauseImage, cniBinDir, cniDir, setup.registryHost, snapshotter, !setup.stargz) + plugins
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logs, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command("containerd", "--config", cfgPath)
	c.cmd.Stdout, c.cmd.Stderr = logs, logs
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.stop()
		logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("containerd log:\n%s", tail(string(b), 40))
		}
		if link, err := netlink.LinkByName(setup.bridge); err == nil {
			netlink.LinkDel(link)
		}
		unmountUnder(dir)
		os.RemoveAll(dir)
	})
	c.conn, err = grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := c.runtime().Version(ctx, &runtimeapi.VersionRequest{})
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd's CRI did not answer within 30 s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *containerd) runtime() runtimeapi.RuntimeServiceClient {
	return runtimeapi.NewRuntimeServiceClient(c.conn)
}

func (c *containerd) images() runtimeapi.ImageServiceClient {
	return runtimeapi.NewImageServiceClient(c.conn)
}

// runtimePIDs are containerd and the shims it started (the runc v2 shim
// is told containerd's socket in its -address argument).
func (c *containerd) runtimePIDs() []int {
	pids := []int{c.cmd.Process.Pid}
	for _, pid := range allPIDs() {
		if cmd := cmdline(pid); strings.Contains(cmd, "containerd-shim") && strings.Contains(cmd, c.socket) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stop ends containerd (SIGTERM, then SIGKILL) and every shim of its still
// running, by PID.
func (c *containerd) stop() {
	if c.conn != nil {
		c.conn.Close()
	}
	shims := c.runtimePIDs()[1:]
	stopProcess(c.cmd, syscall.SIGTERM)
	for _, pid := range shims {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// stopProcess ends cmd's process by its PID: sig, then SIGKILL after 10 s.
func stopProcess(cmd *exec.Cmd, sig syscall.Signal) {
	cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// unmountUnder detaches every mount below dir (containerd's overlay
// snapshots and shm of pods that were not removed, the stargz snapshotter's
// FUSE mounts).
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		f := strings.Fields(lines[i])
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			syscall.Unmount(f[4], syscall.MNT_DETACH)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// layersStored counts containerd's overlay snapshots and content blobs.
func (c *containerd) layersStored() int {
	return countEntries(filepath.Join(c.root, "io.containerd.snapshotter.v1.overlayfs", "snapshots"),
		filepath.Join(c.root, "io.containerd.content.v1.content", "blobs", "sha256"))
}
