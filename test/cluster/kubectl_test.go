package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testLabel marks the namespaces the tests make; the teardown deletes them.
const testLabel = "berth.test/cluster=1"

// uidLabel is the label the kubelet puts on every sandbox and container.
const uidLabel = "io.kubernetes.pod.uid"

// kubectlCmd is kubectl as the cluster's admin.
func (e *env) kubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, e.bin("kubectl"), append([]string{"--kubeconfig", e.admin}, args...)...)
}

// kubectlErr runs kubectl and returns its stdout, or its error with stderr.
func (e *env) kubectlErr(args ...string) (string, error) {
	return e.kubectlIn("", args...)
}

// kubectlIn runs kubectl with stdin and returns its stdout, or its error
// with stderr.
func (e *env) kubectlIn(stdin string, args ...string) (string, error) {
	// Longer than any --timeout the tests give kubectl (startTimeout).
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+time.Minute)
	defer cancel()
	cmd := e.kubectlCmd(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// kubectl runs kubectl and fails t when it fails.
func (e *env) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.kubectlErr(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// apply is kubectl apply of yaml, with IMAGE replaced by the v1 test image.
func (e *env) apply(t *testing.T, yaml string) {
	t.Helper()
	if _, err := e.kubectlIn(strings.ReplaceAll(yaml, "IMAGE", e.imageV1), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// pods lists the pods of namespace ns matching selector ("" for all).
func (e *env) pods(t *testing.T, ns, selector string) []corev1.Pod {
	t.Helper()
	args := []string{"get", "pods", "-n", ns, "-o", "json"}
	if selector != "" {
		args = append(args, "-l", selector)
	}
	var list corev1.PodList
	if err := json.Unmarshal([]byte(e.kubectl(t, args...)), &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func (e *env) pod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal([]byte(e.kubectl(t, "get", "pod", "-n", ns, name, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// waitPod waits until cond holds for pod ns/name and returns it.
func (e *env) waitPod(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	kubeenv.WaitFor(t, timeout, fmt.Sprintf("pod %s/%s %s", ns, name, what), func() (bool, string) {
		p = e.pod(t, ns, name)
		return cond(p), describe(p)
	})
	return p
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func running(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && ready(p) }

// describe is a pod's phase and container states, for failure messages.
func describe(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s phase=%s ip=%s ready=%v", p.Name, p.Status.Phase, p.Status.PodIP, ready(p))
	for _, c := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, " [%s restarts=%d", c.Name, c.RestartCount)
		switch {
		case c.State.Running != nil:
			b.WriteString(" running")
		case c.State.Waiting != nil:
			fmt.Fprintf(&b, " waiting %s: %s", c.State.Waiting.Reason, c.State.Waiting.Message)
		case c.State.Terminated != nil:
			fmt.Fprintf(&b, " terminated %s exit=%d", c.State.Terminated.Reason, c.State.Terminated.ExitCode)
		}
		b.WriteString("]")
	}
	return b.String()
}

// exec is kubectl exec in the pod's first container; a failure fails t.
func (e *env) exec(t *testing.T, ns, pod string, cmd ...string) string {
	t.Helper()
	return e.kubectl(t, append([]string{"exec", "-n", ns, pod, "--"}, cmd...)...)
}

// berthContainers are the node's berth's containers of the pod with uid.
func (n *node) berthContainers(t *testing.T, uid string) []*runtimeapi.Container {
	t.Helper()
	r, err := n.rt.ListContainers(kubeenv.Ctx(t), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{LabelSelector: map[string]string{uidLabel: uid}}})
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	return r.Containers
}

// containerPID is the host PID of the pod's running container (the verbose
// ContainerStatus of the node's berth carries it).
func (n *node) containerPID(t *testing.T, uid string) int {
	t.Helper()
	for _, c := range n.berthContainers(t, uid) {
		if c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		r, err := n.rt.ContainerStatus(kubeenv.Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: c.Id, Verbose: true})
		if err != nil {
			t.Fatalf("ContainerStatus %s: %v", c.Id, err)
		}
		var info struct {
			Pid int `json:"pid"`
		}
		if err := json.Unmarshal([]byte(r.Info["info"]), &info); err != nil || info.Pid <= 0 {
			t.Fatalf("container %s: no pid in verbose status %q (%v)", c.Id, r.Info["info"], err)
		}
		return info.Pid
	}
	t.Fatalf("berth has no running container of pod %s", uid)
	return 0
}
