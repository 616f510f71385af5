package kubelet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ---- static pods ----

// writeManifest puts a static pod manifest into staticPodPath (through a
// rename, so that the kubelet never reads half a file). IMAGE in the text
// is replaced with the test image.
func (e *env) writeManifest(name, yaml string) {
	e.t.Helper()
	tmp := e.path("tmp", name+".yaml")
	if err := os.WriteFile(tmp, []byte(strings.ReplaceAll(yaml, "IMAGE", e.image)), 0o644); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(e.manifests, name+".yaml")); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) removeManifest(name string) {
	e.t.Helper()
	if err := os.Remove(filepath.Join(e.manifests, name+".yaml")); err != nil {
		e.t.Fatal(err)
	}
}

// ---- the kubelet's view ----

// kubeletPods is the kubelet's own list: GET /pods on its read-only port.
func (e *env) kubeletPods() ([]corev1.Pod, error) {
	body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/pods", e.readOnly))
	if err != nil {
		return nil, err
	}
	var list corev1.PodList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		return nil, fmt.Errorf("decode /pods: %w", err)
	}
	return list.Items, nil
}

// kubeletPod returns the static pod made from manifest name, or nil.
func (e *env) kubeletPod(name string) (*corev1.Pod, error) {
	pods, err := e.kubeletPods()
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Name == name+"-"+nodeName {
			return &pods[i], nil
		}
	}
	return nil, nil
}

// mustPod is kubeletPod for a pod that must exist.
func (e *env) mustPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := e.kubeletPod(name)
	if err != nil || p == nil {
		t.Fatalf("kubelet /pods has no pod %s (err %v)", name, err)
	}
	return p
}

func ctrStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// describe is a one-line summary of a pod's status, for failure messages.
func describe(p *corev1.Pod) string {
	if p == nil {
		return "pod not listed by the kubelet"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s ip=%q", p.Status.Phase, p.Status.PodIP)
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range list {
			st := "?"
			switch {
			case c.State.Running != nil:
				st = "running"
			case c.State.Waiting != nil:
				st = "waiting:" + c.State.Waiting.Reason + ":" + c.State.Waiting.Message
			case c.State.Terminated != nil:
				st = fmt.Sprintf("terminated:%s:%d", c.State.Terminated.Reason, c.State.Terminated.ExitCode)
			}
			fmt.Fprintf(&b, " [%s %s ready=%v restarts=%d]", c.Name, st, c.Ready, c.RestartCount)
		}
	}
	return b.String()
}

// waitPod waits until cond holds for the kubelet's pod name.
func (e *env) waitPod(t *testing.T, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	kubeenv.WaitFor(t, timeout, name+": "+what, func() (bool, string) {
		p, err := e.kubeletPod(name)
		if err != nil {
			return false, err.Error()
		}
		last = p
		return p != nil && cond(p), describe(p)
	})
	return last
}

// running: phase Running and every listed container running and ready.
func running(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil || !c.Ready {
			return false
		}
	}
	return true
}

// ---- berth's view (CRI) ----

// reconnect replaces the test's CRI client after berthd restarted.
func (e *env) reconnect() {
	e.t.Helper()
	if e.conn != nil {
		e.conn.Close()
	}
	conn, err := grpc.NewClient("unix://"+e.berthd.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.conn = conn
	e.rt = runtimeapi.NewRuntimeServiceClient(conn)
	e.img = runtimeapi.NewImageServiceClient(conn)
}

const uidLabel = "io.kubernetes.pod.uid"

// sandboxes are berth's pod sandboxes of the pod with uid, in any state.
func (e *env) sandboxes(t *testing.T, uid string) []*runtimeapi.PodSandbox {
	t.Helper()
	r, err := e.rt.ListPodSandbox(kubeenv.Ctx(t), &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{uidLabel: uid}}})
	if err != nil {
		t.Fatalf("ListPodSandbox: %v", err)
	}
	return r.Items
}

// containers are berth's containers of the pod with uid (every attempt it
// still has), optionally only those named name, oldest attempt first.
func (e *env) containers(t *testing.T, uid, name string) []*runtimeapi.Container {
	t.Helper()
	r, err := e.rt.ListContainers(kubeenv.Ctx(t), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{LabelSelector: map[string]string{uidLabel: uid}}})
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	var out []*runtimeapi.Container
	for _, c := range r.Containers {
		if name == "" || c.Metadata.GetName() == name {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Metadata.GetAttempt() < out[j].Metadata.GetAttempt() })
	return out
}

// runningContainer is the one running container named name of pod uid.
func (e *env) runningContainer(t *testing.T, uid, name string) *runtimeapi.Container {
	t.Helper()
	var found *runtimeapi.Container
	for _, c := range e.containers(t, uid, name) {
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			if found != nil {
				t.Fatalf("pod %s: two running containers named %s: %s and %s", uid, name, found.Id, c.Id)
			}
			found = c
		}
	}
	if found == nil {
		t.Fatalf("pod %s: berth has no running container named %s", uid, name)
	}
	return found
}

func (e *env) containerStatus(t *testing.T, id string) *runtimeapi.ContainerStatus {
	t.Helper()
	r, err := e.rt.ContainerStatus(kubeenv.Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return r.Status
}

// containerPID is the host PID of the container's process (berth's verbose
// ContainerStatus carries it).
func (e *env) containerPID(t *testing.T, id string) int {
	t.Helper()
	r, err := e.rt.ContainerStatus(kubeenv.Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(r.Info["info"]), &info); err != nil || info.Pid <= 0 {
		t.Fatalf("container %s: no pid in verbose status %q (%v)", id, r.Info["info"], err)
	}
	return info.Pid
}

func (e *env) sandboxStatus(t *testing.T, id string) *runtimeapi.PodSandboxStatus {
	t.Helper()
	r, err := e.rt.PodSandboxStatus(kubeenv.Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", id, err)
	}
	return r.Status
}

// exec runs cmd in the container (CRI ExecSync) and returns its stdout;
// a non-zero exit fails t.
func (e *env) exec(t *testing.T, id string, cmd ...string) string {
	t.Helper()
	r, err := e.rt.ExecSync(kubeenv.Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 20})
	if err != nil {
		t.Fatalf("ExecSync %s %q: %v", id, cmd, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("ExecSync %s %q: exit %d, stderr %q", id, cmd, r.ExitCode, r.Stderr)
	}
	return string(r.Stdout)
}

// onlySandbox is the single sandbox berth has for pod uid; it must be READY.
func (e *env) onlySandbox(t *testing.T, uid string) *runtimeapi.PodSandbox {
	t.Helper()
	sbs := e.sandboxes(t, uid)
	if len(sbs) != 1 {
		var ids []string
		for _, s := range sbs {
			ids = append(ids, s.Id+"/"+s.State.String())
		}
		t.Fatalf("pod %s: berth has %d sandboxes %v, want exactly one (the kubelet recreated it?)", uid, len(sbs), ids)
	}
	if sbs[0].State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod %s: sandbox %s is %s", uid, sbs[0].Id, sbs[0].State)
	}
	return sbs[0]
}

// ---- log files ----

// logFile is the CRI log of a container attempt under the kubelet's pod log
// folder: PODLOGS/<namespace>_<name>_<uid>/<container>/<attempt>.log.
func (e *env) logFile(p *corev1.Pod, container string, attempt int) string {
	return filepath.Join(e.podLogs, fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), container, fmt.Sprintf("%d.log", attempt))
}
