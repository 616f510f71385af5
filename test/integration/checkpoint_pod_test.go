package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The two containers of the checkpointed pod: a counter, and busybox httpd
// serving a file the container wrote, on TCP 8080 of the pod's network.
const (
	podCounterScript = `i=0; while true; do i=$((i+1)); echo $i > /counter; sleep 0.2; done`
	podHTTPDScript   = `mkdir -p /www && echo served > /www/index.html && exec /bin/busybox httpd -f -p 8080 -h /www`
)

// podCheckpointTimeout is the deadline the tests give CheckpointPod and
// RestorePod (the kubelet always sets one): TCG's pace, not a wait.
const podCheckpointTimeout = 5 * time.Minute

// checkpointPod calls CheckpointPod with a deadline.
func (e *podEnv) checkpointPod(t *testing.T, pod, out string, ids []string, options map[string]string) error {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), podCheckpointTimeout)
	defer cancel()
	_, err := e.d.Runtime.CheckpointPod(c, &runtimeapi.CheckpointPodRequest{PodSandboxId: pod, OutputPath: out, ContainerIds: ids, Options: options})
	return err
}

// restorePod calls RestorePod with a deadline.
func (e *podEnv) restorePod(t *testing.T, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), podCheckpointTimeout)
	defer cancel()
	return e.d.Runtime.RestorePod(c, req)
}

// httpdAnswers says whether httpd answers on 127.0.0.1:8080 of the network
// namespace of container id's pod.
func (e *podEnv) httpdAnswers(t *testing.T, id string) bool {
	t.Helper()
	return eventually(30*time.Second, func() bool {
		return e.exec(t, id, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/").stdout == "served\n"
	})
}

// assertEmptyDir fails t unless dir exists and is empty, after what.
func assertEmptyDir(t *testing.T, dir, after string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Errorf("%s after %s: %v", dir, after, err)
	}
	if len(entries) > 0 {
		t.Errorf("%s after %s holds %v, want nothing", dir, after, entries)
	}
}

// assertThawed fails t unless the cgroups of ctrs in pod are not frozen
// (cgroup v2's cgroup.events; the VM tier).
func (e *podEnv) assertThawed(t *testing.T, pod string, ctrs ...string) {
	t.Helper()
	for _, id := range ctrs {
		if got := readIfExists(t, containerCgroupFile(t, e.podCgroup(t, pod), id, "cgroup.events")); !strings.Contains(got, "frozen 0") {
			t.Errorf("container %s is left frozen: %s", id, got)
		}
	}
}

// treeDigest is the names, modes and contents of every file under dir, as
// one digest: a checkpoint the runtime must not modify.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h.Write([]byte(p + fi.Mode().String() + fi.ModTime().String() + "\n"))
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ckptPod is a running pod of the two containers the tests checkpoint,
// with their configs.
type ckptPod struct {
	cfg                  *runtimeapi.PodSandboxConfig
	id, counter, httpd   string
	counterCfg, httpdCfg *runtimeapi.ContainerConfig
}

// runCkptPod runs the pod "ckpt-pod" of a counter and an httpd.
func (e *podEnv) runCkptPod(t *testing.T) ckptPod {
	t.Helper()
	p := ckptPod{cfg: e.podConfig("ckpt-pod"), counterCfg: e.ctrConfig("counter", "/bin/sh", "-c", podCounterScript),
		httpdCfg: e.ctrConfig("httpd", "/bin/sh", "-c", podHTTPDScript)}
	p.id = e.runPod(t, p.cfg)
	p.counter = e.runContainer(t, p.id, p.cfg, p.counterCfg)
	p.httpd = e.runContainer(t, p.id, p.cfg, p.httpdCfg)
	return p
}

// podManifest is what the tests read of a pod checkpoint's pod.json
// (docs/operations.md).
type podManifest struct {
	Version    int `json:"version"`
	Containers []struct {
		Name, ID, Dir string
	} `json:"containers"`
}

// TestCheckpointPod: where CRIU works, CheckpointPod checkpoints two
// running containers of a pod together, into the empty folder given, and
// leaves both running and thawed: pod.json names them, each has its
// folder with CRIU's images and what CheckpointContainer's archive holds.
// While CRIU dumps the first container, the second is frozen already (one
// moment of the pod); a checkpoint held there until the call's deadline
// answers DeadlineExceeded with everything thawed and the folder emptied.
// A container CRIU refuses (an established TCP connection) half way
// fails the call naming CRIU's reason, with the folder emptied and every
// container running, thawed. Where CRIU does not work (this host) the call
// is refused, naming CRIU, with nothing written.
func TestCheckpointPod(t *testing.T) {
	gate := newCRIUGate(t)
	e := startPodEnvTOML(t, v1.Config{}, gate.toml())
	p := e.runCkptPod(t)
	podCfg, pod, counter, httpd := p.cfg, p.id, p.counter, p.httpd
	out := t.TempDir()
	if !criuWorks(t) {
		assertCode(t, e.checkpointPod(t, pod, out, []string{counter, httpd}, nil), one(codes.FailedPrecondition), "criu")
		assertEmptyDir(t, out, "a refused checkpoint")
		e.assertCounts(t, counter, "a refused checkpoint")
		e.removePod(t, pod)
		e.assertNoLeaks(t)
		return
	}
	if !e.httpdAnswers(t, counter) {
		t.Fatal("the pod's httpd does not answer")
	}
	breakHostRuncConf(t)
	start := time.Now()
	if err := e.checkpointPod(t, pod, out, []string{counter, httpd}, nil); err != nil {
		t.Fatalf("CheckpointPod: %v", err)
	}
	took := time.Since(start)
	t.Logf("pod checkpoint took %s", took.Round(time.Millisecond))
	e.assertThawed(t, pod, counter, httpd)
	e.assertCounts(t, counter, "the pod checkpoint")
	if !e.httpdAnswers(t, counter) {
		t.Error("the pod's httpd does not answer after the checkpoint")
	}
	var m podManifest
	if err := json.Unmarshal([]byte(readIfExists(t, filepath.Join(out, "pod.json"))), &m); err != nil {
		t.Fatalf("pod.json: %v", err)
	}
	var names []string
	for _, c := range m.Containers {
		names = append(names, c.Name)
		for _, f := range []string{"checkpoint/inventory.img", "checkpoint/pstree.img", "config.dump", "spec.dump", "rootfs-diff.tar", "dump.log"} {
			if _, err := os.Stat(filepath.Join(out, c.Dir, f)); err != nil {
				t.Errorf("container %s's checkpoint: %v", c.Name, err)
			}
		}
	}
	if m.Version != 1 || !slices.Equal(names, []string{"counter", "httpd"}) {
		t.Errorf("pod.json: version %d, containers %v; want version 1, counter and httpd", m.Version, names)
	}

	// CRIU held (by the gate) as it dumps the first container, httpd:
	// the counter is frozen already. At the call's deadline less the
	// shim's grace (sandbox's checkpointGrace, 10 s) CRIU is stopped, and
	// everything is thawed.
	deadline := heldCheckpointTimeout(took) + 10*time.Second
	reach, drain := gate.hold(t)
	late := t.TempDir()
	done := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		_, err := e.d.Runtime.CheckpointPod(c, &runtimeapi.CheckpointPodRequest{PodSandboxId: pod, OutputPath: late, ContainerIds: []string{httpd, counter}})
		done <- err
	}()
	if ok, log := reach(deadline); !ok {
		t.Fatalf("CRIU did not log dumping a process before the call's deadline; its log ends %q; the checkpoint answered %v", log, <-done)
	}
	if got := readIfExists(t, containerCgroupFile(t, e.podCgroup(t, pod), counter, "cgroup.events")); !strings.Contains(got, "frozen 1") {
		t.Errorf("while CRIU dumps httpd the counter, second to be dumped, is not frozen: %s", got)
	}
	assertCode(t, <-done, one(codes.DeadlineExceeded), "timed out")
	gate.release(t)
	if ok, log := drain(30 * time.Second); !ok {
		t.Errorf("CRIU's log has writers 30 s after the checkpoint stopped at its deadline; it ends %q", log)
	}
	assertEmptyDir(t, late, "a pod checkpoint past its deadline")
	e.assertThawed(t, pod, counter, httpd)
	e.assertCounts(t, counter, "a pod checkpoint past its deadline")
	if !e.httpdAnswers(t, counter) {
		t.Error("the pod's httpd does not answer after a pod checkpoint past its deadline")
	}

	// CRIU refuses the second container (an established TCP connection)
	// after it has dumped the first.
	connected := e.runContainer(t, pod, podCfg, e.ctrConfig("connected", "/bin/sh", "-c",
		`(sleep 100000 | /bin/busybox nc -l -p 9000 >/dev/null) & sleep 1; (sleep 100000 | /bin/busybox nc 127.0.0.1 9000 >/dev/null) & exec sleep 100000`))
	if !eventually(30*time.Second, func() bool {
		return e.exec(t, connected, "/bin/sh", "-c", "cat /proc/net/tcp* | grep -q ':2328 01 '").code == 0
	}) {
		t.Fatalf("the connection on port 9000 is not established: %s", e.sh(t, connected, "cat /proc/net/tcp*; ps"))
	}
	failed := t.TempDir()
	assertCode(t, e.checkpointPod(t, pod, failed, []string{counter, connected}, nil), one(codes.FailedPrecondition), "TCP")
	assertEmptyDir(t, failed, "a pod checkpoint CRIU failed half way")
	e.assertThawed(t, pod, counter, httpd, connected)
	e.assertCounts(t, counter, "a pod checkpoint CRIU failed half way")
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestCheckpointPodRefused: requests CheckpointPod cannot serve are refused
// before anything is frozen or written, naming the field: an unknown
// option, an output path that is relative, missing or not empty, no
// containers, a duplicate, a container of another pod, one that is not
// running, an unknown pod. The output folder stays as it was, the
// containers run on.
func TestCheckpointPodRefused(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	podCfg := e.podConfig("ckpt-pod")
	pod := e.runPod(t, podCfg)
	counter := e.runContainer(t, pod, podCfg, e.ctrConfig("counter", "/bin/sh", "-c", podCounterScript))
	// Not runContainer: /bin/true can be gone before a wait for RUNNING.
	exited := e.create(t, pod, podCfg, e.ctrConfig("exited", "/bin/true"))
	e.start(t, exited)
	e.waitState(t, exited, runtimeapi.ContainerState_CONTAINER_EXITED)
	otherCfg := e.podConfig("other-pod")
	other := e.runPod(t, otherCfg)
	stranger := e.runContainer(t, other, otherCfg, e.ctrConfig("stranger", "/bin/sleep", "100000"))
	out := t.TempDir()
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "callers-file"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name    string
		pod     string
		out     string
		ids     []string
		options map[string]string
		code    codes.Code
		mention []string
	}{
		{"unknown option", pod, out, []string{counter}, map[string]string{"bogus-key": "1"}, codes.InvalidArgument, []string{"options", "bogus-key"}},
		{"relative output", pod, "relative/dir", []string{counter}, nil, codes.InvalidArgument, []string{"output_path", "absolute"}},
		{"missing output", pod, filepath.Join(out, "none"), []string{counter}, nil, codes.InvalidArgument, []string{"output_path"}},
		{"output not empty", pod, full, []string{counter}, nil, codes.InvalidArgument, []string{"output_path", "not empty"}},
		{"no containers", pod, out, nil, nil, codes.InvalidArgument, []string{"container_ids"}},
		{"duplicate", pod, out, []string{counter, counter}, nil, codes.InvalidArgument, []string{"container_ids[1]"}},
		{"another pod's", pod, out, []string{counter, stranger}, nil, codes.InvalidArgument, []string{"container_ids[1]", other}},
		{"not running", pod, out, []string{counter, exited}, nil, codes.FailedPrecondition, []string{exited, "not running"}},
		{"unknown container", pod, out, []string{counter, "no-such-container"}, nil, codes.NotFound, []string{"container_ids[1]"}},
		{"unknown pod", "no-such-pod", out, []string{counter}, nil, codes.NotFound, []string{"pod_sandbox_id"}},
		{"no pod", "", out, []string{counter}, nil, codes.InvalidArgument, []string{"pod_sandbox_id"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertCode(t, e.checkpointPod(t, c.pod, c.out, c.ids, c.options), one(c.code), c.mention...)
		})
	}
	assertEmptyDir(t, out, "the refusals")
	if got := readIfExists(t, filepath.Join(full, "callers-file")); got != "mine" {
		t.Errorf("the caller's file in the non-empty output folder: %q, want it kept", got)
	}
	e.assertCounts(t, counter, "the refusals")
	e.removePod(t, pod)
	e.removePod(t, other)
	e.assertNoLeaks(t)
}

// TestRestorePod: where CRIU works, a pod of two containers (a counter,
// an httpd) checkpointed with CheckpointPod and removed comes back with
// RestorePod into a new pod config: both created, not running; started,
// the counter goes on past its checkpointed count, httpd answers in the
// new pod's network namespace. The checkpoint folder is left as it was.
func TestRestorePod(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	p := e.runCkptPod(t)
	pod, counter, httpd := p.id, p.counter, p.httpd
	out := t.TempDir()
	if !criuWorks(t) {
		assertCode(t, e.checkpointPod(t, pod, out, []string{counter, httpd}, nil), one(codes.FailedPrecondition), "criu")
		e.removePod(t, pod)
		e.assertNoLeaks(t)
		return
	}
	if !eventually(60*time.Second, func() bool { return e.counter(t, counter) >= 25 }) {
		t.Fatal("the counter does not reach 25")
	}
	if !e.httpdAnswers(t, counter) {
		t.Fatal("the pod's httpd does not answer")
	}
	if err := e.checkpointPod(t, pod, out, []string{counter, httpd}, nil); err != nil {
		t.Fatalf("CheckpointPod: %v", err)
	}
	e.removePod(t, pod)
	digest := treeDigest(t, out)

	newCfg := e.podConfig("restored-pod")
	resp, err := e.restorePod(t, &runtimeapi.RestorePodRequest{CheckpointPath: out, Config: newCfg,
		ContainerConfigs: []*runtimeapi.ContainerConfig{p.counterCfg, p.httpdCfg}})
	if err != nil {
		t.Fatalf("RestorePod: %v", err)
	}
	if resp.PodSandboxId == "" || len(resp.RestoredContainers) != 2 {
		t.Fatalf("RestorePod answered %v; want a pod and two containers", resp)
	}
	if got := e.podStatus(t, resp.PodSandboxId).GetMetadata().GetName(); got != "restored-pod" {
		t.Errorf("the restored pod is named %q, want the new config's restored-pod", got)
	}
	ids := map[string]string{}
	for _, c := range resp.RestoredContainers {
		ids[c.Name] = c.ContainerId
		if st := e.status(t, c.ContainerId); st.State != runtimeapi.ContainerState_CONTAINER_CREATED || st.StartedAt != 0 {
			t.Errorf("restored container %s (%s): %v, started at %d; want created, never started", c.Name, c.ContainerId, st.State, st.StartedAt)
		}
	}
	if ids["counter"] == "" || ids["httpd"] == "" || ids["counter"] == ids["httpd"] {
		t.Fatalf("restored containers %v; want counter and httpd, each its own", ids)
	}
	e.start(t, ids["counter"])
	e.start(t, ids["httpd"])
	if n := e.counter(t, ids["counter"]); n < 25 {
		t.Errorf("the restored counter is at %d, below the 25 it had passed before the checkpoint: it started afresh", n)
	}
	e.assertCounts(t, ids["counter"], "the restore")
	// From the counter's container: the new pod's network namespace,
	// which both share.
	if !e.httpdAnswers(t, ids["counter"]) {
		t.Error("the restored httpd does not answer in the new pod's network namespace")
	}
	if got := treeDigest(t, out); got != digest {
		t.Error("RestorePod changed the checkpoint folder")
	}
	e.removePod(t, resp.PodSandboxId)
	e.assertNoLeaks(t)
}

// fakePodCheckpoint writes a pod checkpoint of one container, "app", of
// the env's image, whose spec.dump is the spec berth makes of cfg (that of
// a container created from it in a pod since removed), with CRIU images
// that are not: RestorePod takes it, StartContainer's CRIU cannot.
func (e *podEnv) fakePodCheckpoint(t *testing.T, cfg *runtimeapi.ContainerConfig) string {
	t.Helper()
	podCfg := e.podConfig("fake-source")
	pod := e.runPod(t, podCfg)
	id := e.create(t, pod, podCfg, cfg)
	spec := readIfExists(t, filepath.Join(e.d.State, "pods", pod, "containers", id, "config.json"))
	e.removePod(t, pod)
	img, err := e.d.Images.ImageStatus(t.Context(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: e.image}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"pod.json":                                  `{"version":1,"podSandboxId":"p0","podSandboxConfig":{},"containers":[{"name":"app","id":"c0","dir":"containers/c0"}]}`,
		"containers/c0/config.dump":                 `{"id":"c0","name":"app","rootfsImageName":"` + e.image + `","rootfsImageRef":"` + img.Image.Id + `"}`,
		"containers/c0/spec.dump":                   spec,
		"containers/c0/checkpoint/inventory.img":    "not a CRIU image",
		"containers/c0/checkpoint/pstree.img":       "not a CRIU image",
		"containers/c0/checkpoint/descriptors.json": `["/dev/null","/dev/null","/dev/null"]`,
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRestorePodRefused: RestorePod refuses, naming the field, what it
// cannot restore, and leaves no pod, container, cgroup, network namespace
// or IP lease: a missing or relative checkpoint path, an unknown option or
// runtime handler, no pod config, container configs whose names are not
// the checkpoint's (none, another, one twice), an image that is not the
// checkpointed container's or not on the node, and, found once the pod is
// made, a command that is not the checkpointed process's and a terminal.
// A matching request makes the pod and its container, created, with the
// checkpoint left as it was; its start fails in CRIU (the images are not
// CRIU's) and nothing of it runs.
func TestRestorePodRefused(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	appCfg := func() *runtimeapi.ContainerConfig { return e.ctrConfig("app", "/bin/sleep", "100000") }
	ckpt := e.fakePodCheckpoint(t, appCfg())
	digest := treeDigest(t, ckpt)
	other := e.pushImage(t, "berth/busybox:other", v1.Config{Env: []string{"OTHER=1"}})
	podCfg := e.podConfig("restored")

	with := func(change func(*runtimeapi.ContainerConfig)) []*runtimeapi.ContainerConfig {
		c := appCfg()
		change(c)
		return []*runtimeapi.ContainerConfig{c}
	}
	same := with(func(*runtimeapi.ContainerConfig) {})
	for _, c := range []struct {
		name    string
		req     *runtimeapi.RestorePodRequest
		code    codes.Code
		mention []string
	}{
		{"missing checkpoint", &runtimeapi.RestorePodRequest{CheckpointPath: filepath.Join(ckpt, "none"), Config: podCfg, ContainerConfigs: same},
			codes.InvalidArgument, []string{"checkpoint_path"}},
		{"relative path", &runtimeapi.RestorePodRequest{CheckpointPath: "relative", Config: podCfg, ContainerConfigs: same},
			codes.InvalidArgument, []string{"checkpoint_path", "absolute"}},
		{"unknown option", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg, ContainerConfigs: same, Options: map[string]string{"bogus-key": "1"}},
			codes.InvalidArgument, []string{"options", "bogus-key"}},
		{"unknown handler", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg, ContainerConfigs: same, RuntimeHandler: "kata"},
			codes.InvalidArgument, []string{"runtime_handler", "kata"}},
		{"no config", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, ContainerConfigs: same},
			codes.InvalidArgument, []string{"config"}},
		{"no container configs", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg},
			codes.InvalidArgument, []string{"container_configs", "app"}},
		{"another name", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg,
			ContainerConfigs: with(func(c *runtimeapi.ContainerConfig) { c.Metadata.Name = "web" })},
			codes.InvalidArgument, []string{"container_configs[0].metadata.name", "web"}},
		{"a name twice", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg, ContainerConfigs: append(same, appCfg())},
			codes.InvalidArgument, []string{"container_configs[1].metadata.name", "twice"}},
		{"another image", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg,
			ContainerConfigs: with(func(c *runtimeapi.ContainerConfig) { c.Image.Image = other })},
			codes.InvalidArgument, []string{"container_configs[0].image.image", "checkpointed from"}},
		{"image not on node", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg,
			ContainerConfigs: with(func(c *runtimeapi.ContainerConfig) { c.Image.Image = "127.0.0.1:1/not/pulled:1" })},
			codes.FailedPrecondition, []string{"127.0.0.1:1/not/pulled:1", "pull it first"}},
		{"another command", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg,
			ContainerConfigs: with(func(c *runtimeapi.ContainerConfig) { c.Command = []string{"/bin/sleep", "5"} })},
			codes.InvalidArgument, []string{"command", "checkpointed process"}},
		{"terminal", &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg,
			ContainerConfigs: with(func(c *runtimeapi.ContainerConfig) { c.Tty = true })},
			codes.FailedPrecondition, []string{"tty"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.restorePod(t, c.req)
			assertCode(t, err, one(c.code), c.mention...)
			if pods := e.listPodIDs(t, nil); len(pods) != 0 {
				t.Errorf("the refused restore left pods %v", pods)
			}
		})
	}
	e.assertNoLeaks(t)

	resp, err := e.restorePod(t, &runtimeapi.RestorePodRequest{CheckpointPath: ckpt, Config: podCfg, ContainerConfigs: same})
	if err != nil {
		t.Fatalf("RestorePod: %v", err)
	}
	if len(resp.RestoredContainers) != 1 || resp.RestoredContainers[0].Name != "app" || resp.RestoredContainers[0].ContainerId == "" {
		t.Fatalf("RestorePod answered %v; want the container app", resp)
	}
	id := resp.RestoredContainers[0].ContainerId
	if st := e.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Errorf("the restored container is %v, want created", st.State)
	}
	_, err = e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: id})
	assertCode(t, err, one(codes.FailedPrecondition), "criu")
	if processRuns(id) {
		t.Errorf("a process of the failed restore %s runs", id)
	}
	if got := treeDigest(t, ckpt); got != digest {
		t.Error("RestorePod changed the checkpoint folder")
	}
	e.removePod(t, resp.PodSandboxId)
	e.assertNoLeaks(t)
}
