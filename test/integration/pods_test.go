package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podEnv is a daemon with the busybox test image pulled. Its pods go under a
// cgroup parent of their own (berth-itest/<state folder name>), so that tests
// running at the same time (here or in another checkout) never see each
// other's cgroups.
type podEnv struct {
	d      *harness.Daemon
	reg    *harness.Registry
	image  string // the pulled reference
	logs   string // a pod log directory
	parent string // cgroup parent of this env's pods, below berth-itest
}

func startPodEnv(t *testing.T, cfg v1.Config) *podEnv {
	t.Helper()
	return startPodEnvTOML(t, cfg, "")
}

// startPodEnvTOML is startPodEnv with extraTOML appended to berthd's config.
func startPodEnvTOML(t *testing.T, cfg v1.Config, extraTOML string) *podEnv {
	t.Helper()
	return startPodEnvWith(t, cfg, harness.Options{ConfigTOML: extraTOML})
}

// startPodEnvWith is startPodEnv with berthd started with o, its ConfigTOML
// put before the registry's settings (its top-level keys before their
// tables).
func startPodEnvWith(t *testing.T, cfg v1.Config, o harness.Options) *podEnv {
	t.Helper()
	harness.RequireIntegration(t)
	reg := harness.NewRegistry(t)
	o.ConfigTOML += "\n" + harness.PlainHTTP(reg.Host())
	d := harness.StartDaemon(t, o)
	e := newPodEnv(t, d, reg)
	e.image = e.pushImage(t, "berth/busybox:pods", cfg)
	return e
}

// newPodEnv is the env of berthd d and registry reg, with no image pulled
// yet. Every env is made here, so that none lacks a cgroup parent of its
// own: pods of envs without one shared /pod-NAME, and RemovePodSandbox of
// one test's pod then found another test's container, still running, in
// the pod cgroup's tree (TestPullLazyStartsBeforeFetched failed EBUSY
// beside the other lazy pull tests, whose pods are all named "lazy").
func newPodEnv(t *testing.T, d *harness.Daemon, reg *harness.Registry) *podEnv {
	t.Helper()
	e := &podEnv{d: d, reg: reg, logs: t.TempDir(), parent: "berth-itest/" + filepath.Base(d.State)}
	// Registered after the daemon's own cleanups, so it runs before them.
	t.Cleanup(func() { e.teardown(t) })
	return e
}

// pushImage pushes a busybox image with cfg as repoTag, pulls it and
// returns its reference.
func (e *podEnv) pushImage(t *testing.T, repoTag string, cfg v1.Config) string {
	t.Helper()
	p := e.reg.Push(t, repoTag, harness.BusyboxImage(t, harness.ImageSpec{Config: cfg}))
	mustPull(t, e.d, p.Name, p.ID)
	return p.Name
}

// teardown is best effort, for tests that failed half-way: it removes the
// pods that are left, stops berthd, unmounts the private bind mount berthd
// made of STATE/pods (so that the state folder can be deleted) and removes
// this env's cgroup parent. Tests assert cleanliness themselves
// (assertNoLeaks) before they end.
func (e *podEnv) teardown(t *testing.T) {
	if e.d.Running() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if list, err := e.d.Runtime.ListPodSandbox(c, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range list.Items {
				if _, err := e.d.Runtime.RemovePodSandbox(c, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
					t.Logf("teardown: remove pod %s: %v", p.Id, err)
				}
			}
		}
		e.d.Stop()
	}
	for range 4 {
		if unix.Unmount(filepath.Join(e.d.State, "pods"), unix.MNT_DETACH) != nil {
			break
		}
	}
	removeCgroupDirs(e.parent)
	removeCgroupDirs("berth-itest") // only once no env uses it
}

func (e *podEnv) podConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		Hostname:     name,
		LogDirectory: e.logs,
		Labels:       map[string]string{"app": name},
		Annotations:  map[string]string{"note": "kept as given"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: "/" + e.parent + "/pod-" + name,
		},
	}
}

func (e *podEnv) runPod(t *testing.T, cfg *runtimeapi.PodSandboxConfig) string {
	t.Helper()
	resp, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	return resp.PodSandboxId
}

// ctrConfig is a container config running cmd in the env's image, logging
// to NAME.log, labelled container=NAME.
func (e *podEnv) ctrConfig(name string, cmd ...string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: e.image},
		Command:  cmd,
		LogPath:  name + ".log",
		Labels:   map[string]string{"container": name},
	}
}

func (e *podEnv) createContainer(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, name string, cmd ...string) string {
	t.Helper()
	return e.create(t, pod, podCfg, e.ctrConfig(name, cmd...))
}

// create creates a container from a full config.
func (e *podEnv) create(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) string {
	t.Helper()
	resp, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: pod, SandboxConfig: podCfg, Config: cfg})
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", cfg.GetMetadata().GetName(), err)
	}
	return resp.ContainerId
}

func (e *podEnv) status(t *testing.T, id string) *runtimeapi.ContainerStatus {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStatus(t.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStatus: %v", err)
	}
	return resp.Status
}

// waitState polls until the container reaches state.
func (e *podEnv) waitState(t *testing.T, id string, state runtimeapi.ContainerState) *runtimeapi.ContainerStatus {
	t.Helper()
	// Generous: in the VM tier's emulation, beside parallel tests and a
	// loaded host, a container that fills its memory limit took over 30
	// seconds to be killed (CI, stop 42).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := e.status(t, id)
		if st.State == state {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s is %s, want %s", id, st.State, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removePod stops and removes the pod (twice each: both are idempotent) and
// asserts that berth kept nothing of it or of its containers.
func (e *podEnv) removePod(t *testing.T, pod string) {
	t.Helper()
	e.removePodCgroup(t, pod, true)
}

// removePodCgroup is removePod for a pod whose cgroup is also another live
// pod's (ownCgroup false: an earlier attempt of the same kubelet pod), which
// must then be kept.
func (e *podEnv) removePodCgroup(t *testing.T, pod string, ownCgroup bool) {
	t.Helper()
	cgroup := e.podCgroup(t, pod)
	list, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	for range 2 {
		if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
			t.Fatalf("StopPodSandbox: %v", err)
		}
	}
	for range 2 {
		if _, err := e.d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
			t.Fatalf("RemovePodSandbox: %v", err)
		}
	}
	assertPodGone(t, e.d, pod)
	switch dirs := harness.CgroupDirs(cgroup); {
	case ownCgroup && len(dirs) != 0:
		t.Errorf("cgroup of the removed pod left behind: %v", dirs)
	case !ownCgroup && len(dirs) == 0:
		t.Errorf("cgroup %s, which a live pod shares, was removed with the pod", cgroup)
	}
	for _, c := range list.Containers {
		if _, err := os.Lstat(filepath.Join(e.d.Root, "containers", c.Id)); !os.IsNotExist(err) {
			t.Errorf("writable layer of container %s left behind (%v)", c.Id, err)
		}
		if m := mountsMentioning(c.Id); len(m) != 0 {
			t.Errorf("mounts of container %s left behind: %q", c.Id, m)
		}
	}
}

// podCgroup is the pod's cgroup as berth recorded it (verbose status).
func (e *podEnv) podCgroup(t *testing.T, pod string) string {
	t.Helper()
	var info struct {
		Pod struct {
			Cgroup string `json:"cgroup"`
		} `json:"pod"`
	}
	e.verbosePodInfo(t, pod, &info)
	if info.Pod.Cgroup == "" || !strings.HasPrefix(info.Pod.Cgroup, "/") {
		t.Fatalf("pod %s: verbose info names no cgroupfs cgroup (%q)", pod, info.Pod.Cgroup)
	}
	return info.Pod.Cgroup
}

// assertPodGone checks that no mount, pin, folder or live shim of the pod
// remains.
func assertPodGone(t *testing.T, d *harness.Daemon, pod string) {
	t.Helper()
	for _, m := range mountsMentioning(pod) {
		if strings.HasPrefix(m, d.Root) || strings.HasPrefix(m, d.State) {
			t.Errorf("mount of removed pod left: %s", m)
		}
	}
	if _, err := os.Stat(filepath.Join(d.State, "pods", pod)); !os.IsNotExist(err) {
		t.Errorf("pod folder left behind: %v", err)
	}
	if pids := harness.LiveProcessesWithArg(filepath.Join(d.State, "pods", pod)); len(pids) != 0 {
		t.Errorf("shim processes of the removed pod still alive: %v", pids)
	}
}

// assertNoLeaks is the end of every pod test: berthd has no pod and no
// container left, and nothing of them remains on the host: no mount under
// its root or state folder (but the private bind mount of STATE/pods it
// keeps while it runs), no pod folder or pin, no writable layer, no cgroup
// under the env's parent, no live shim, nothing half-written in the store.
func (e *podEnv) assertNoLeaks(t *testing.T) {
	t.Helper()
	pods, err := e.d.Runtime.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("pods left: %v, %v", pods.GetItems(), err)
	}
	ctrs, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{})
	if err != nil || len(ctrs.Containers) != 0 {
		t.Errorf("containers left: %v, %v", ctrs.GetContainers(), err)
	}
	podsRoot := filepath.Join(e.d.State, "pods")
	mounts, err := harness.MountPointsUnder(e.d.Root, e.d.State)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m != podsRoot {
			t.Errorf("mount left: %s", m)
		}
	}
	for _, dir := range []string{podsRoot, filepath.Join(e.d.Root, "containers")} {
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s is not empty: %v", dir, entries)
		}
	}
	if cgs := harness.CgroupDirsUnder(e.parent); len(cgs) != 0 {
		t.Errorf("cgroups left behind: %v", cgs)
	}
	if pids := harness.LiveProcessesWithArg(podsRoot); len(pids) != 0 {
		t.Errorf("shim processes still alive: %v", pids)
	}
	if leases := e.leases(t); len(leases) != 0 {
		t.Errorf("IP leases left: %v", leases)
	}
	if bridge, ok := e.builtinBridge(t); ok {
		if n := linksOn(t, bridge); n != 0 {
			t.Errorf("%d veths left on bridge %s", n, bridge)
		}
	}
	harness.AssertNoLeaks(t, e.d.Root, harness.WantSnapshots(e.storedLayers(t)))
}

// storedLayers counts the distinct layers of the images berthd lists, and
// checks that no container holds a lease on any of them any more.
func (e *podEnv) storedLayers(t *testing.T) int {
	t.Helper()
	list, err := e.d.Images.ListImages(t.Context(), &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatalf("ListImages: %v", err)
	}
	layers := map[string]bool{}
	for _, img := range list.Images {
		resp, err := e.d.Images.ImageStatus(t.Context(), &runtimeapi.ImageStatusRequest{
			Image: &runtimeapi.ImageSpec{Image: img.Id}, Verbose: true})
		if err != nil {
			t.Fatalf("ImageStatus %s: %v", img.Id, err)
		}
		var info struct {
			ChainIDs []string `json:"chainIDs"`
			Leases   []string `json:"leases"`
		}
		if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
			t.Fatalf("image %s verbose info: %v", img.Id, err)
		}
		if len(info.Leases) != 0 {
			t.Errorf("image %s still leased by %v", img.Id, info.Leases)
		}
		for _, c := range info.ChainIDs {
			layers[c] = true
		}
	}
	return len(layers)
}

// mountPoints lists the mount points of this mount namespace (none when
// mountinfo cannot be read).
func mountPoints() []string {
	m, _ := harness.MountPoints()
	return m
}

// mountsMentioning lists the mount points whose path contains s.
func mountsMentioning(s string) []string {
	var out []string
	for _, m := range mountPoints() {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}

func TestPodLifecycle(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("lifecycle")
	pod := e.runPod(t, cfg)

	ps, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatal(err)
	}
	if ps.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY || ps.Status.Labels["app"] != "lifecycle" ||
		ps.Status.Annotations["note"] != "kept as given" || ps.Status.Metadata.Name != "lifecycle" {
		t.Errorf("PodSandboxStatus = %+v", ps.Status)
	}
	if _, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg}); err == nil {
		t.Error("the same pod metadata ran twice")
	} else {
		assertCode(t, err, one(codes.AlreadyExists), "already exists")
	}

	ctr := e.createContainer(t, pod, cfg, "hello", "/bin/sh", "-c", "echo out; echo err >&2; hostname; exit 3")
	if st := e.status(t, ctr); st.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Fatalf("created container is %s", st.State)
	}
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	st := e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	if st.ExitCode != 3 || st.Reason != "Error" || st.StartedAt == 0 || st.FinishedAt < st.StartedAt {
		t.Errorf("exited status = code %d reason %q started %d finished %d", st.ExitCode, st.Reason, st.StartedAt, st.FinishedAt)
	}
	if want := filepath.Join(e.logs, "hello.log"); st.LogPath != want {
		t.Errorf("log_path = %q, want %q", st.LogPath, want)
	}
	log, err := os.ReadFile(st.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{" stdout F out\n", " stderr F err\n", " stdout F lifecycle\n"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}

	sleeper := e.createContainer(t, pod, cfg, "sleeper", "/bin/sleep", "1000")
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: sleeper}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, sleeper, runtimeapi.ContainerState_CONTAINER_RUNNING)
	ex, err := e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: sleeper, Cmd: []string{"/bin/sh", "-c", "cat /etc/hostname; exit 7"}, Timeout: 5})
	if err != nil || ex.ExitCode != 7 || strings.TrimSpace(string(ex.Stdout)) != "lifecycle" {
		t.Errorf("ExecSync = %+v, %v", ex, err)
	}
	list, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil || len(list.Containers) != 1 || list.Containers[0].Id != sleeper {
		t.Errorf("running containers = %v, %v", list.GetContainers(), err)
	}
	begin := time.Now()
	if _, err := e.d.Runtime.StopContainer(t.Context(), &runtimeapi.StopContainerRequest{ContainerId: sleeper, Timeout: 2}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > 4*time.Second {
		t.Errorf("StopContainer took %s with a 2 s timeout", took)
	}
	if st := e.status(t, sleeper); st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("stopped container is %s", st.State)
	}
	for range 2 {
		if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: sleeper}); err != nil {
			t.Fatalf("RemoveContainer: %v", err)
		}
	}
	if _, err := e.d.Runtime.ContainerStatus(t.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: sleeper}); err == nil {
		t.Error("status of a removed container succeeded")
	} else {
		assertCode(t, err, one(codes.NotFound), "")
	}
	// StopContainer is idempotent too, as StopPodSandbox: an unknown ID is OK.
	for _, id := range []string{sleeper, "0123456789abcdef-unknown"} {
		if _, err := e.d.Runtime.StopContainer(t.Context(), &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("StopContainer of unknown %s: %v", id, err)
		}
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// removeCgroupDirs removes the cgroup the tests name as (part of) the
// kubelet's cgroup_parent, in every hierarchy, once it is empty.
func removeCgroupDirs(name string) {
	for _, d := range harness.CgroupDirs(name) {
		os.Remove(d)
	}
}
