package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// cniPluginDir is where Debian's containernetworking-plugins installs the
// reference plugins (make deps).
const cniPluginDir = "/usr/lib/cni"

// TestNetworkStep starts 50 pods one after another on the built-in network,
// then 50 on the reference CNI plugins (bridge with host-local, portmap,
// loopback), and prints the p50/p99 of the "network" step of
// RunPodSandbox (from each pod's verbose status timeline). Pods have no
// host port and no shared PID namespace, as most pods.
func TestNetworkStep(t *testing.T) {
	harness.RequireEnv(t, "BERTH_BENCH")
	t.Cleanup(func() {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/berth-bench-net")
		for _, dir := range dirs {
			os.Remove(dir)
		}
	})

	builtin := harness.StartDaemon(t, harness.Options{}) // the harness gives it a bridge of its own
	b := networkSteps(t, builtin)
	builtin.Stop()

	if _, err := os.Stat(filepath.Join(cniPluginDir, "bridge")); err != nil {
		t.Fatalf("the reference CNI plugins are not installed (make deps): %v", err)
	}
	dir := t.TempDir()
	pid := os.Getpid()
	bridge := fmt.Sprintf("bb%d", pid%100000)
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(bridge); err == nil {
			netlink.LinkDel(link)
		}
	})
	confDir := filepath.Join(dir, "net.d")
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "berth-bench-%d", "plugins": [
		{"type": "bridge", "bridge": %q, "isGateway": true,
		 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.%d.%d.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
		{"type": "portmap", "capabilities": {"portMappings": true}},
		{"type": "loopback"}]}`, pid, bridge, 250+pid%6, 200+pid%56, filepath.Join(dir, "ipam"))
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-bench.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cni := harness.StartDaemon(t, harness.Options{ConfigTOML: fmt.Sprintf(
		"[network]\nmode = \"cni\"\ncni_conf_dir = %q\ncni_bin_dirs = [%q]\n", confDir, cniPluginDir)})
	c := networkSteps(t, cni)

	fmt.Printf("network built-in: p50 %s, p99 %s over %d pods\n", pct(b, 50), pct(b, 99), pods)
	fmt.Printf("network cni (bridge+host-local, portmap, loopback): p50 %s, p99 %s over %d pods\n", pct(c, 50), pct(c, 99), pods)
}

// networkSteps runs 50 pods on d, one after another, and returns their
// network steps; it removes them before it returns.
func networkSteps(t *testing.T, d *harness.Daemon) []time.Duration {
	t.Helper()
	ctx := t.Context()
	var steps []time.Duration
	var ids []string
	for i := range pods {
		cfg := &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: fmt.Sprint("net-", i), Namespace: "bench", Uid: fmt.Sprint("net-uid-", i)},
			Hostname: fmt.Sprint("net-", i),
			Linux: &runtimeapi.LinuxPodSandboxConfig{CgroupParent: fmt.Sprintf("/berth-bench-net/pod%d", i),
				SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{
					Pid: runtimeapi.NamespaceMode_CONTAINER}}},
		}
		pod, err := d.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, pod.PodSandboxId)
		steps = append(steps, podStep(t, d, pod.PodSandboxId, "network"))
	}
	for _, id := range ids {
		if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	return steps
}

// podStep is the duration of one start step of the pod (verbose status).
func podStep(t *testing.T, d *harness.Daemon, pod, name string) time.Duration {
	t.Helper()
	st, err := d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Timeline []struct {
			Name     string
			Duration time.Duration
		}
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatal(err)
	}
	for _, s := range info.Timeline {
		if s.Name == name {
			return s.Duration
		}
	}
	t.Fatalf("pod %s: no %q step in %+v", pod, name, info.Timeline)
	return 0
}
