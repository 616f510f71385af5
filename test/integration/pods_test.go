package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podEnv is a daemon with the busybox test image pulled.
type podEnv struct {
	d     *harness.Daemon
	image string // the pulled reference
	logs  string // a pod log directory
}

func startPodEnv(t *testing.T, cfg v1.Config) *podEnv {
	t.Helper()
	t.Cleanup(func() { removeCgroupParent("berth-itest") })
	reg, d := start(t, "")
	p := reg.Push(t, "berth/busybox:pods", harness.BusyboxImage(t, harness.ImageSpec{Config: cfg}))
	mustPull(t, d, p.Name, p.ID)
	return &podEnv{d: d, image: p.Name, logs: t.TempDir()}
}

func (e *podEnv) podConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		Hostname:     name,
		LogDirectory: e.logs,
		Labels:       map[string]string{"app": name},
		Annotations:  map[string]string{"note": "kept as given"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: "/berth-itest/pod-" + name,
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

func (e *podEnv) createContainer(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, name string, cmd ...string) string {
	t.Helper()
	resp, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: pod, SandboxConfig: podCfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: name},
			Image:    &runtimeapi.ImageSpec{Image: e.image},
			Command:  cmd,
			LogPath:  name + ".log",
			Labels:   map[string]string{"container": name},
		},
	})
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", name, err)
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
	deadline := time.Now().Add(10 * time.Second)
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

// removePod removes the pod and asserts berth kept nothing of it.
func (e *podEnv) removePod(t *testing.T, pod string) {
	t.Helper()
	for range 2 { // idempotent
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
}

// assertPodGone checks that no mount, pin, folder, cgroup or live shim of the
// pod remains.
func assertPodGone(t *testing.T, d *harness.Daemon, pod string) {
	t.Helper()
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, dir := range []string{d.Root, d.State} {
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, dir) && strings.Contains(line, pod) {
				t.Errorf("mount of removed pod left: %s", line)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(d.State, "pods", pod)); !os.IsNotExist(err) {
		t.Errorf("pod folder left behind: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(d.Root, "containers"))
	if len(entries) != 0 {
		t.Errorf("container layers left behind: %v", entries)
	}
	if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/berth-itest/*/"); len(cgs) != 0 {
		t.Errorf("cgroups left behind: %v", cgs)
	}
	if pids := harness.LiveProcessesWithArg(t, filepath.Join(d.State, "pods", pod)); len(pids) != 0 {
		t.Errorf("shim processes of the removed pod still alive: %v", pids)
	}
}

func TestPodLifecycle(t *testing.T) {
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
	e.removePod(t, pod)
}

// removeCgroupParent removes the parent cgroup the tests name as the
// kubelet's cgroup_parent, in every hierarchy, once no pod uses it.
func removeCgroupParent(name string) {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	for _, d := range dirs {
		os.Remove(d)
	}
}
