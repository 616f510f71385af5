package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness/nriplugin"
	"github.com/containerd/nri/pkg/api"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// nriEnv is a berthd hosting NRI plugins on a socket of its own, and the
// test plugin (testdata/nriplugin) to run against it.
type nriEnv struct {
	*podEnv
	socket, pluginDir, plugin string
}

// buildNRIPlugin returns the test plugin: BERTH_NRIPLUGIN_BIN (the VM
// tier's, built on the host), else built here.
func buildNRIPlugin(t *testing.T) string {
	t.Helper()
	return buildPluginBin(t, "BERTH_NRIPLUGIN_BIN", ".", "./testdata/nriplugin")
}

// buildPluginBin returns the plugin binary the environment variable env
// names (the VM tier's, built on the host), else builds package pkg in
// the module of folder dir.
func buildPluginBin(t *testing.T, env, dir, pkg string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// startNRIEnv starts a berthd with NRI on: its socket in a short temp
// folder, its plugin_path (and plugin_config_path) pluginDir, and extra
// [nri] keys.
func startNRIEnv(t *testing.T, extraNRI string) *nriEnv {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "nri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	e := &nriEnv{socket: filepath.Join(sockDir, "nri.sock"), pluginDir: t.TempDir(), plugin: buildNRIPlugin(t)}
	toml := fmt.Sprintf("[nri]\ndisable = false\nsocket_path = %q\nplugin_path = %q\nplugin_config_path = %q\n%s",
		e.socket, e.pluginDir, e.pluginDir, extraNRI)
	e.podEnv = startPodEnvTOML(t, v1.Config{}, metricsTOML+toml)
	return e
}

// startPlugin runs the test plugin as NAME against berthd's socket and
// waits until berthd has it registered and synchronised.
func (e *nriEnv) startPlugin(t *testing.T, name string, cfg nriplugin.Config) *exec.Cmd {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(e.plugin, "-socket", e.socket, "-name", name, "-config", string(b))
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("plugin %s output:\n%s", name, out)
		}
	})
	// As berthd's text log quotes it.
	e.waitLog(t, fmt.Sprintf(`plugin \"50-%s\" connected and synchronized`, name))
	return cmd
}

// waitLog waits up to 20 s for berthd to log line.
func (e *nriEnv) waitLog(t *testing.T, line string) {
	t.Helper()
	if !eventually(20*time.Second, func() bool { return strings.Contains(e.d.Logs(), line) }) {
		t.Fatalf("berthd did not log %q", line)
	}
}

// refusedCreate checks that creating container name in pod is refused
// with FailedPrecondition saying want, leaving the made containers alone.
func (e *nriEnv) refusedCreate(t *testing.T, pod string, cfg *runtimeapi.PodSandboxConfig, name, want string, made int) {
	t.Helper()
	_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: pod, SandboxConfig: cfg, Config: e.ctrConfig(name, sleeper...)})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want FailedPrecondition saying %q", name, err, want)
	}
	if ids := e.listContainerIDs(t, nil); len(ids) != made {
		t.Errorf("%s: containers %v, want the %d made", name, ids, made)
	}
}

// needTwoCPUs skips a test that sets a container's cpuset to CPU 0 on a
// machine where that is every CPU: it would prove nothing.
func needTwoCPUs(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs: a cpuset of CPU 0 would be every CPU")
	}
}

// cpusAllowed is the CPUs the container's processes may run on.
func (e *nriEnv) cpusAllowed(t *testing.T, ctr string) string {
	t.Helper()
	return e.sh(t, ctr, "sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status")
}

// specOf is the container's OCI spec, from its verbose status.
func (e *nriEnv) specOf(t *testing.T, ctr string) map[string]any {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStatus(t.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: ctr, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct{ Spec map[string]any }
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatal(err)
	}
	return info.Spec
}

// TestNRIAdjustments runs a container a plugin adjusts (environment,
// annotations, a mount, an rlimit, cpuset, memory limit, a device, an OCI
// hook, OOM score) and sees each in the running container, and a
// container the plugin leaves alone without any.
func TestNRIAdjustments(t *testing.T) {
	t.Parallel()
	needTwoCPUs(t)
	e := startNRIEnv(t, "")
	shared, hookDir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "greeting"), []byte("from-nri"), 0o644); err != nil {
		t.Fatal(err)
	}
	oom := 123
	e.startPlugin(t, "adjuster", nriplugin.Config{
		Match:       "adjusted",
		Env:         map[string]string{"NRI_ADJUSTED": "yes"},
		Annotations: map[string]string{"berth.test/nri": "annotated"},
		Mount:       &api.Mount{Source: shared, Destination: "/nri-mount", Type: "bind", Options: []string{"rbind", "ro"}},
		Rlimit:      &api.POSIXRlimit{Type: "RLIMIT_NOFILE", Soft: 1111, Hard: 2222},
		Cpuset:      "0",
		MemoryLimit: 96 << 20,
		Device:      &api.LinuxDevice{Path: "/dev/nri-null", Type: "c", Major: 1, Minor: 3, FileMode: api.FileMode(0o666)},
		Hook:        &api.Hook{Path: "/bin/sh", Args: []string{"sh", "-c", "cat > " + hookDir + "/state-$$.json"}},
		OOMScoreAdj: &oom,
	})
	cfg := e.podConfig("nri-adjust")
	pod := e.runPod(t, cfg)
	adjusted := e.runContainer(t, pod, cfg, e.ctrConfig("adjusted", sleeper...))
	plain := e.runContainer(t, pod, cfg, e.ctrConfig("plain", sleeper...))

	memFile := "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	if cgroupV2() {
		memFile = "/sys/fs/cgroup/memory.max"
	}
	checks := []struct {
		what, script, want string
	}{
		{"env", "echo ${NRI_ADJUSTED:-unset}", "yes"},
		{"mount", "cat /nri-mount/greeting 2>/dev/null || echo none", "from-nri"},
		{"rlimit", "awk '/Max open files/ {print $4, $5}' /proc/self/limits", "1111 2222"},
		{"memory limit", "cat " + memFile, "100663296"},
		{"device", "echo x > /dev/nri-null && stat -c %t:%T /dev/nri-null || echo none", "1:3"},
		{"oom score", "cat /proc/self/oom_score_adj", "123"},
	}
	for _, c := range checks {
		if got := e.sh(t, adjusted, c.script); got != c.want {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
		if got := e.sh(t, plain, c.script); got == c.want {
			t.Errorf("%s: the container the plugin left alone has it too (%q): it does not come from the plugin", c.what, got)
		}
	}
	if got := e.cpusAllowed(t, adjusted); got != "0" {
		t.Errorf("cpuset: CPUs %q, want 0", got)
	}
	if got := e.cpusAllowed(t, plain); got == "0" {
		t.Errorf("cpuset: the container the plugin left alone runs on CPU 0 alone too")
	}
	ann, _ := e.specOf(t, adjusted)["annotations"].(map[string]any)
	if ann["berth.test/nri"] != "annotated" {
		t.Errorf("annotations: %v, want berth.test/nri=annotated", ann)
	}
	// The createRuntime hook ran once, for the adjusted container alone:
	// it wrote the state the runtime gave it.
	states, _ := filepath.Glob(filepath.Join(hookDir, "state-*.json"))
	if len(states) != 1 {
		t.Fatalf("hook ran %d times, want once", len(states))
	}
	if b, _ := os.ReadFile(states[0]); !strings.Contains(string(b), adjusted) {
		t.Errorf("hook's state %s does not name the adjusted container %s", b, adjusted)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNRICDIDevice checks that a CDI device a plugin adds is given whole,
// from berth's CDI spec folders, and that one no spec defines refuses the
// container, naming it, with nothing left behind.
func TestNRICDIDevice(t *testing.T) {
	t.Parallel()
	specDir := t.TempDir()
	cdi := writeCDISpec(t, t.TempDir(), specDir)
	e := startNRIEnv(t, fmt.Sprintf("[cdi]\nspec_dirs = [%q]\n", cdi.specDir))
	e.startPlugin(t, "gpu", nriplugin.Config{Match: "gpu", CDIDevice: cdiDeviceName})
	e.startPlugin(t, "nogpu", nriplugin.Config{Match: "undefined", CDIDevice: "vendor.test/dev=none"})
	cfg := e.podConfig("nri-cdi")
	pod := e.runPod(t, cfg)
	given := e.runContainer(t, pod, cfg, e.ctrConfig("gpu", sleeper...))
	plain := e.runContainer(t, pod, cfg, e.ctrConfig("plain", sleeper...))
	check := "echo ${BERTH_CDI_TEST:-unset}; [ -c " + cdiCtrPath + " ] && echo node || echo no-node"
	if got := e.sh(t, given, check); got != "one\nnode" {
		t.Errorf("container given the CDI device: %q, want its env and node", got)
	}
	if got := e.sh(t, plain, check); got != "unset\nno-node" {
		t.Errorf("container the plugins left alone: %q, want no env and no node", got)
	}
	e.refusedCreate(t, pod, cfg, "undefined", "vendor.test/dev=none", 2)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNRIEvents checks that a plugin is told of every pod and container
// event, in order (a pod's in-place resize with its new resources), and
// of the pods and containers that were there when it connected, whose
// cpuset its sync answer changes.
func TestNRIEvents(t *testing.T) {
	t.Parallel()
	needTwoCPUs(t)
	e := startNRIEnv(t, "")
	cfg := e.podConfig("nri-events")
	pod := e.runPod(t, cfg)
	before := e.runContainer(t, pod, cfg, e.ctrConfig("before", sleeper...))
	if got := e.cpusAllowed(t, before); got == "0" {
		t.Fatal("the container runs on CPU 0 alone before the plugin: the sync's update would prove nothing")
	}
	events := filepath.Join(t.TempDir(), "events")
	e.startPlugin(t, "recorder", nriplugin.Config{Events: events, SyncCpuset: "0", Match: "before"})
	if !eventually(20*time.Second, func() bool { return e.cpusAllowed(t, before) == "0" }) {
		t.Errorf("sync: the plugin's update left CPUs %q, want 0", e.cpusAllowed(t, before))
	}

	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("after", sleeper...))
	if _, err := e.d.Runtime.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: ctr, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 128 << 20}}); err != nil {
		t.Fatal(err)
	}
	e.stop(t, ctr, 0)
	if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	// A pod made with the plugin there, whose container exits on its own
	// when the test says: told as stopped before it is removed.
	cfg2 := e.podConfig("nri-events-2")
	pod2 := e.runPod(t, cfg2)
	exits := e.runContainer(t, pod2, cfg2, e.ctrConfig("exits", "/bin/sh", "-c", "until [ -e /tmp/go ]; do sleep 0.1; done"))
	if _, err := e.d.Runtime.UpdatePodSandboxResources(t.Context(), &runtimeapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: pod2, Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 256 << 20}}); err != nil {
		t.Fatal(err)
	}
	e.sh(t, exits, "touch /tmp/go")
	if !eventually(20*time.Second, func() bool { return e.status(t, exits).State == runtimeapi.ContainerState_CONTAINER_EXITED }) {
		t.Fatal("the container did not exit")
	}
	if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: exits}); err != nil {
		t.Fatal(err)
	}
	e.removePod(t, pod2)
	e.removePod(t, pod)

	want := []string{
		"Synchronize before",
		"CreateContainer after", "PostCreateContainer after", "StartContainer after", "PostStartContainer after",
		"UpdateContainer after", "PostUpdateContainer after", "StopContainer after", "RemoveContainer after",
		"RunPodSandbox",
		"CreateContainer exits", "PostCreateContainer exits", "StartContainer exits", "PostStartContainer exits",
		"UpdatePodSandbox memory 268435456", "PostUpdatePodSandbox",
		"StopContainer exits", "RemoveContainer exits", "StopPodSandbox", "RemovePodSandbox",
		"StopContainer before", "StopPodSandbox", "RemoveContainer before", "RemovePodSandbox",
	}
	var got []string
	if !eventually(10*time.Second, func() bool {
		b, _ := os.ReadFile(events)
		got = strings.Split(strings.TrimSpace(string(b)), "\n")
		return len(got) >= len(want)
	}) || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	e.assertNoLeaks(t)
}

// TestNRIUpdates checks that a plugin's answer to the kubelet's update of
// a container sets the container's cpuset with the kubelet's limits, and
// that a plugin's update of its own sets it over the limits in force.
func TestNRIUpdates(t *testing.T) {
	t.Parallel()
	needTwoCPUs(t)
	e := startNRIEnv(t, "")
	e.startPlugin(t, "updater", nriplugin.Config{Match: "resized", UpdateCpuset: "0"})
	e.startPlugin(t, "pinner", nriplugin.Config{Match: "pinned", UnsolicitedCpuset: "0"})
	cfg := e.podConfig("nri-update")
	pod := e.runPod(t, cfg)
	memFile := "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	if cgroupV2() {
		memFile = "/sys/fs/cgroup/memory.max"
	}

	resized := e.runContainer(t, pod, cfg, e.ctrConfig("resized", sleeper...))
	if got := e.cpusAllowed(t, resized); got == "0" {
		t.Fatal("the container runs on CPU 0 alone before the update: the test would prove nothing")
	}
	if _, err := e.d.Runtime.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: resized, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 128 << 20}}); err != nil {
		t.Fatal(err)
	}
	if got := e.cpusAllowed(t, resized); got != "0" {
		t.Errorf("kubelet's update: CPUs %q, want the plugin's 0", got)
	}
	if got := e.sh(t, resized, "cat "+memFile); got != "134217728" {
		t.Errorf("kubelet's update: memory limit %s, want the kubelet's 134217728", got)
	}

	cc := e.ctrConfig("pinned", sleeper...)
	cc.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20}}
	pinned := e.runContainer(t, pod, cfg, cc)
	if !eventually(20*time.Second, func() bool { return e.cpusAllowed(t, pinned) == "0" }) {
		t.Errorf("plugin's own update: CPUs %q, want 0", e.cpusAllowed(t, pinned))
	}
	if got := e.sh(t, pinned, "cat "+memFile); got != "67108864" {
		t.Errorf("plugin's own update: memory limit %s, want the one in force, 67108864", got)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNRIRefusals checks that a container a plugin rejects, or one whose
// adjustment berth cannot make, is refused with the reason, leaving
// nothing behind, and that the other plugins are told it is gone; and
// that a pod's resize a plugin rejects is refused and not recorded.
func TestNRIRefusals(t *testing.T) {
	t.Parallel()
	e := startNRIEnv(t, "")
	events := filepath.Join(t.TempDir(), "events")
	e.startPlugin(t, "recorder", nriplugin.Config{Events: events, Match: "none"})
	e.startPlugin(t, "rejecter", nriplugin.Config{Match: "rejected", Reject: "no room for you on this node"})
	e.startPlugin(t, "sysctler", nriplugin.Config{Match: "sysctl", Sysctl: map[string]string{"net.ipv4.ip_forward": "1"}})
	cfg := e.podConfig("nri-refuse")
	pod := e.runPod(t, cfg)
	for _, c := range []struct{ name, want string }{
		{"rejected", "no room for you on this node"},
		{"sysctl", "NRI adjustment linux.sysctl"},
	} {
		e.refusedCreate(t, pod, cfg, c.name, c.want, 0)
	}
	// A pod's resize the plugin refuses is not recorded.
	podRejecter := nriplugin.Config{Match: "nri-refuse", Reject: "this pod stays its size"}
	e.startPlugin(t, "podrejecter", podRejecter)
	_, err := e.d.Runtime.UpdatePodSandboxResources(t.Context(), &runtimeapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: pod, Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 256 << 20}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), podRejecter.Reject) {
		t.Errorf("refused pod resize: %v, want FailedPrecondition saying %q", err, podRejecter.Reject)
	}
	var info struct {
		Pod struct{ Config json.RawMessage }
	}
	e.verbosePodInfo(t, pod, &info)
	if strings.Contains(string(info.Pod.Config), "268435456") {
		t.Errorf("refused pod resize recorded: %s", info.Pod.Config)
	}
	b, _ := os.ReadFile(events)
	for _, name := range []string{"rejected", "sysctl"} {
		if !strings.Contains(string(b), "RemoveContainer "+name) {
			t.Errorf("the recording plugin was not told that %s is gone:\n%s", name, b)
		}
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNRIPluginFailures checks that a plugin that hangs, and one that
// crashes, at a CreateContainer hold it no longer than the request
// timeout: the container is made without them, and each is dropped,
// logged and counted.
func TestNRIPluginFailures(t *testing.T) {
	t.Parallel()
	e := startNRIEnv(t, "plugin_request_timeout = \"1s\"\n")
	cfg := e.podConfig("nri-failures")
	pod := e.runPod(t, cfg)
	addr := metricsAddr(t, e.podEnv)
	for _, c := range []struct {
		name string
		cfg  nriplugin.Config
	}{
		{"hanger", nriplugin.Config{Match: "hung", Hang: true, Env: map[string]string{"NRI_ADJUSTED": "yes"}}},
		{"crasher", nriplugin.Config{Match: "crashed", Crash: true, Env: map[string]string{"NRI_ADJUSTED": "yes"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.startPlugin(t, c.name, c.cfg)
			if m := scrape(t, addr); m["berth_nri_plugins"] != 1 {
				t.Fatalf("berth_nri_plugins = %v with the plugin connected, want 1", m["berth_nri_plugins"])
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			resp, err := e.d.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
				PodSandboxId: pod, SandboxConfig: cfg, Config: e.ctrConfig(c.cfg.Match, sleeper...)})
			if err != nil {
				t.Fatalf("CreateContainer with a failing plugin: %v", err)
			}
			e.start(t, resp.ContainerId)
			if got := e.sh(t, resp.ContainerId, "echo ${NRI_ADJUSTED:-unset}"); got != "unset" {
				t.Errorf("env NRI_ADJUSTED = %q from a plugin that failed", got)
			}
			m := scrape(t, addr)
			if m["berth_nri_plugins"] != 0 {
				t.Errorf("berth_nri_plugins = %v after the failure, want 0 (dropped)", m["berth_nri_plugins"])
			}
			series := fmt.Sprintf(`berth_nri_plugin_errors_total{operation="CreateContainer",plugin="50-%s"}`, c.name)
			if m[series] < 1 {
				t.Errorf("%s = %v, want at least 1", series, m[series])
			}
			e.waitLog(t, fmt.Sprintf("closing plugin 50-%s", c.name))
		})
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNRIPluginPath checks that berthd starts the plugins of plugin_path,
// each configured from plugin_config_path, with no socket when
// disable_connections is set.
func TestNRIPluginPath(t *testing.T) {
	t.Parallel()
	e := startNRIEnv(t, "disable_connections = true\n")
	b, err := os.ReadFile(e.plugin)
	if err != nil {
		t.Fatal(err)
	}
	// berthd reads plugin_path at start: a restart takes the plugin.
	if err := os.WriteFile(filepath.Join(e.pluginDir, "10-launched"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	conf, _ := json.Marshal(nriplugin.Config{Env: map[string]string{"NRI_LAUNCHED": "yes"}})
	if err := os.WriteFile(filepath.Join(e.pluginDir, "10-launched.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	e.d.Restart()
	if _, err := os.Stat(e.socket); !os.IsNotExist(err) {
		t.Errorf("socket %s with disable_connections: %v", e.socket, err)
	}
	cfg := e.podConfig("nri-launched")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("any", sleeper...))
	if got := e.sh(t, ctr, "echo ${NRI_LAUNCHED:-unset}"); got != "yes" {
		t.Errorf("env NRI_LAUNCHED = %q, want the launched plugin's yes", got)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNRIUlimitAdjuster runs the protocol's own sample plugin,
// ulimit-adjuster (github.com/containerd/nri v0.4.0, pinned in
// testdata/ulimitadjuster: a stub four years older than berth's
// adaptation), started by berthd from plugin_path: the rlimits a pod's
// annotation asks for one of its containers are that container's, not
// its sibling's, and an annotation the plugin cannot parse refuses the
// container with the plugin's reason, leaving nothing behind.
func TestNRIUlimitAdjuster(t *testing.T) {
	t.Parallel()
	e := startNRIEnv(t, "disable_connections = true\n")
	b, err := os.ReadFile(buildPluginBin(t, "BERTH_ULIMIT_ADJUSTER_BIN", "testdata/ulimitadjuster",
		"github.com/containerd/nri/plugins/ulimit-adjuster"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.pluginDir, "20-ulimit-adjuster"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	e.d.Restart() // berthd reads plugin_path at start
	e.waitLog(t, `pre-installed NRI plugin \"20-ulimit-adjuster\" synchronization success`)

	cfg := e.podConfig("nri-ulimits")
	cfg.Annotations["ulimits.nri.containerd.io/container.limited"] = `
- type: RLIMIT_NOFILE
  hard: 4096
  soft: 1024
- type: memlock
  hard: 987654
  soft: 645321
`
	cfg.Annotations["ulimits.nri.containerd.io/container.misspelt"] = "- type: nofiles\n  hard: 1\n"
	pod := e.runPod(t, cfg)
	limited := e.runContainer(t, pod, cfg, e.ctrConfig("limited", sleeper...))
	sibling := e.runContainer(t, pod, cfg, e.ctrConfig("sibling", sleeper...))
	limits := "awk '/Max open files/ {print $4, $5} /Max locked memory/ {print $4, $5}' /proc/self/limits"
	if got := e.sh(t, limited, limits); got != "1024 4096\n645321 987654" {
		t.Errorf("limits of the annotated container: %q, want nofile 1024 4096 and memlock 645321 987654", got)
	}
	if got := e.sh(t, sibling, limits); strings.Contains(got, "1024 4096") || strings.Contains(got, "645321") {
		t.Errorf("limits of the container the annotation does not name: %q, the plugin's", got)
	}
	e.refusedCreate(t, pod, cfg, "misspelt", `failed to parse type: "nofiles"`, 2)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNRIHostResources checks that a plugin's cgroup v2 unified keys and
// hugepage limit, at create, and its unified key answering the kubelet's
// update, reach the container where the host has cgroup v2 and the
// hugetlb controller, and where it lacks them refuse the container (or
// the update) naming the adjustment, leaving nothing behind (changing
// nothing).
func TestNRIHostResources(t *testing.T) {
	t.Parallel()
	e := startNRIEnv(t, "")
	e.startPlugin(t, "unifier", nriplugin.Config{Match: "unified", Unified: map[string]string{"memory.high": "67108864"}})
	e.startPlugin(t, "hugepager", nriplugin.Config{Match: "hugepaged", HugepageLimit: &api.HugepageLimit{PageSize: "2MB", Limit: 4 << 20}})
	e.startPlugin(t, "reunifier", nriplugin.Config{Match: "resized", UpdateUnified: map[string]string{"memory.high": "50331648"}})
	cfg := e.podConfig("nri-host-resources")
	pod := e.runPod(t, cfg)
	hugetlbFile := "/sys/fs/cgroup/hugetlb/hugetlb.2MB.limit_in_bytes"
	if cgroupV2() {
		hugetlbFile = "/sys/fs/cgroup/hugetlb.2MB.max"
	}
	made := 0
	for _, c := range []struct {
		name, adjustment, file, want string
		hostHasIt                    bool
	}{
		{"unified", "linux.resources.unified", "/sys/fs/cgroup/memory.high", "67108864", cgroupV2()},
		{"hugepaged", "linux.resources.hugepage_limits", hugetlbFile, "4194304", hostHasHugetlb()},
	} {
		if c.hostHasIt {
			ctr := e.runContainer(t, pod, cfg, e.ctrConfig(c.name, sleeper...))
			made++
			if got := e.sh(t, ctr, "cat "+c.file); got != c.want {
				t.Errorf("%s: %s is %q, want the plugin's %s", c.name, c.file, got, c.want)
			}
			continue
		}
		t.Logf("%s: the host lacks it: the container is to be refused", c.adjustment)
		e.refusedCreate(t, pod, cfg, c.name, "NRI adjustment "+c.adjustment, made)
	}
	// The plugin's answer to the kubelet's update of a running container.
	resized := e.runContainer(t, pod, cfg, e.ctrConfig("resized", sleeper...))
	_, err := e.d.Runtime.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: resized, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 128 << 20}})
	memFile, high := "/sys/fs/cgroup/memory/memory.limit_in_bytes", "echo none"
	if cgroupV2() {
		memFile, high = "/sys/fs/cgroup/memory.max", "cat /sys/fs/cgroup/memory.high"
	}
	got := e.sh(t, resized, "cat "+memFile+"; "+high)
	switch {
	case cgroupV2() && (err != nil || got != "134217728\n50331648"):
		t.Errorf("update answered with a unified key: %v, memory max and high %q, want the kubelet's 134217728 and the plugin's 50331648", err, got)
	case !cgroupV2() && (status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "NRI update linux.resources.unified")):
		t.Errorf("update answered with a unified key: %v, want FailedPrecondition naming linux.resources.unified", err)
	case !cgroupV2() && strings.HasPrefix(got, "134217728"):
		t.Errorf("the refused update set the memory limit: %q", got)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// hostHasHugetlb says whether this host's cgroups have the hugetlb
// controller.
func hostHasHugetlb() bool {
	if cgroupV2() {
		b, _ := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		return slices.Contains(strings.Fields(string(b)), "hugetlb")
	}
	_, err := os.Stat("/sys/fs/cgroup/hugetlb")
	return err == nil
}
