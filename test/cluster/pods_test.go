package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podsYAML are the single pods of the scenarios; they are applied together
// (HOSTPORT and HOSTNETPORT replaced) and each scenario waits for its own.
const podsYAML = `apiVersion: v1
kind: Pod
metadata: {name: logger, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: logger
    image: IMAGE
    command: ["sh", "-c", "echo start; i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done"]
---
apiVersion: v1
kind: Pod
metadata: {name: crasher, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: crasher
    image: IMAGE
    command: ["sh", "-c", "if [ -e /state/ran ]; then echo second run; exec sleep 3600; fi; touch /state/ran; echo first run; exit 3"]
    volumeMounts: [{name: state, mountPath: /state}]
  volumes: [{name: state, emptyDir: {}}]
---
apiVersion: v1
kind: Pod
metadata: {name: attach, namespace: e2e}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  containers:
  - name: cat
    image: IMAGE
    command: ["cat"]
    stdin: true
    stdinOnce: true
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: e2e}
data: {greeting: "hello from a configmap"}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: e2e}
stringData: {password: "s3cret-berth"}
---
apiVersion: v1
kind: Pod
metadata: {name: volumes, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "echo written > /cache/f; sleep 3600"]
    volumeMounts:
    - {name: cache, mountPath: /cache}
    - {name: settings, mountPath: /config}
    - {name: creds, mountPath: /secret}
  volumes:
  - {name: cache, emptyDir: {}}
  - {name: settings, configMap: {name: settings}}
  - {name: creds, secret: {secretName: creds}}
---
apiVersion: v1
kind: Pod
metadata: {name: liveness, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "touch /tmp/alive; sleep 6; rm /tmp/alive; sleep 3600"]
    livenessProbe:
      exec: {command: ["test", "-f", "/tmp/alive"]}
      periodSeconds: 1
      failureThreshold: 1
---
apiVersion: v1
kind: Pod
metadata: {name: gated, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    readinessProbe:
      exec: {command: ["test", "-f", "/tmp/ready"]}
      periodSeconds: 1
---
apiVersion: v1
kind: Pod
metadata: {name: oom, namespace: e2e}
spec:
  restartPolicy: Never
  containers:
  - name: hog
    image: IMAGE
    command: ["sh", "-c", "x=0123456789abcdef; while true; do x=$x$x; done"]
    resources:
      limits: {memory: 32Mi}
---
apiVersion: v1
kind: Pod
metadata: {name: hostport, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: web
    image: IMAGE
    command: ["/bin/web", "serve", ":8080"]
    ports: [{containerPort: 8080, hostPort: HOSTPORT}]
---
apiVersion: v1
kind: Pod
metadata: {name: hostnet, namespace: e2e}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
  - name: web
    image: IMAGE
    command: ["/bin/web", "serve", "127.0.0.1:HOSTNETPORT"]
---
apiVersion: v1
kind: Pod
metadata: {name: seccomp, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  securityContext:
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata: {name: userns, namespace: e2e}
spec:
  hostUsers: false
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata: {name: limits, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    resources:
      requests: {cpu: 100m, memory: 32Mi}
      limits: {cpu: 250m, memory: 64Mi}
`

// applyPods starts every single-pod scenario at once.
func (e *env) applyPods(t *testing.T) {
	e.hostPort, e.hostNetPort = kubeenv.FreePort(t), kubeenv.FreePort(t)
	e.apply(t, strings.NewReplacer("HOSTNETPORT", strconv.Itoa(e.hostNetPort), "HOSTPORT", strconv.Itoa(e.hostPort)).Replace(podsYAML))
}

// logs: kubectl logs, logs -f following new lines, and --previous showing
// the output of the container's last attempt.
func (e *env) logs(t *testing.T) {
	e.waitPod(t, ns, "logger", startTimeout, "Running", running)
	kubeenv.WaitFor(t, 20*time.Second, "kubectl logs logger", func() (bool, string) {
		out, err := e.kubectlErr("logs", "-n", ns, "logger")
		return err == nil && strings.HasPrefix(out, "start\ntick 1\n"), fmt.Sprintf("%q %v", out, err)
	})

	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := e.kubectlCmd(c, "logs", "-f", "-n", ns, "logger", "--tail", "1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var ticks []int
	for len(ticks) < 3 && sc.Scan() {
		var n int
		if _, err := fmt.Sscanf(sc.Text(), "tick %d", &n); err != nil {
			t.Errorf("kubectl logs -f: line %q", sc.Text())
			break
		}
		ticks = append(ticks, n)
	}
	cancel()
	_ = cmd.Wait()
	if len(ticks) != 3 || ticks[1] != ticks[0]+1 || ticks[2] != ticks[1]+1 {
		t.Errorf("kubectl logs -f followed ticks %v, want 3 consecutive ones", ticks)
	}

	// crasher exits 3 once, then runs (its emptyDir remembers).
	p := e.waitPod(t, ns, "crasher", startTimeout, "restarted once and running", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount == 1 && cs[0].LastTerminationState.Terminated != nil && running(p)
	})
	if code := p.Status.ContainerStatuses[0].LastTerminationState.Terminated.ExitCode; code != 3 {
		t.Errorf("crasher's last exit code %d, want 3", code)
	}
	if prev := e.kubectl(t, "logs", "--previous", "-n", ns, "crasher"); prev != "first run\n" {
		t.Errorf("kubectl logs --previous crasher: %q, want the first run's", prev)
	}
	if now := e.kubectl(t, "logs", "-n", ns, "crasher"); now != "second run\n" {
		t.Errorf("kubectl logs crasher: %q, want the second run's", now)
	}
}

// streams: kubectl exec (with its exit code), cp both ways, attach and
// port-forward, all through the API server, the kubelet and berth.
func (e *env) streams(t *testing.T) {
	pods := e.pods(t, ns, "app=web")
	if len(pods) == 0 {
		t.Fatal("no web pod")
	}
	web := pods[0].Name
	if v := e.exec(t, ns, web, "cat", "/etc/web-version"); v != "v1\n" {
		t.Errorf("kubectl exec cat /etc/web-version: %q", v)
	}
	_, err := e.kubectlErr("exec", "-n", ns, web, "--", "sh", "-c", "exit 7")
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("kubectl exec sh -c 'exit 7': %v, want exit code 7", err)
	}

	local := e.path("cp-in")
	content := fmt.Sprintf("copied at %s\n", time.Now())
	if err := os.WriteFile(local, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	e.kubectl(t, "cp", local, ns+"/"+web+":/tmp/copied")
	if got := e.exec(t, ns, web, "cat", "/tmp/copied"); got != content {
		t.Errorf("kubectl cp into the pod: %q, want %q", got, content)
	}
	back := e.path("cp-out")
	e.kubectl(t, "cp", ns+"/"+web+":/tmp/copied", back)
	if b, err := os.ReadFile(back); err != nil || string(b) != content {
		t.Errorf("kubectl cp out of the pod: %q %v", b, err)
	}

	e.waitPod(t, ns, "attach", startTimeout, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	out, err := e.kubectlIn("hello through attach\n", "attach", "-i", "-q", "-n", ns, "attach")
	if err != nil || !strings.Contains(out, "hello through attach\n") {
		t.Errorf("kubectl attach -i: %q %v", out, err)
	}
	e.waitPod(t, ns, "attach", 30*time.Second, "Succeeded once its stdin closed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })

	e.portForwardGet(t, ns, web, "v1 "+web+"\n", 30*time.Second)
}

// portForwardGet runs kubectl port-forward from a free loopback port to
// port 8080 of pod, and waits until a GET through it answers want.
func (e *env) portForwardGet(t *testing.T, namespace, pod, want string, timeout time.Duration) {
	t.Helper()
	port := kubeenv.FreePort(t)
	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	pf := e.kubectlCmd(c, "port-forward", "-n", namespace, "pod/"+pod, fmt.Sprintf("%d:8080", port))
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = pf.Wait() }()
	kubeenv.WaitFor(t, timeout, "kubectl port-forward to "+pod, func() (bool, string) {
		body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		return err == nil && body == want, fmt.Sprintf("%q %v", body, err)
	})
}

// volumes: emptyDir, configMap, secret and the projected service account
// token, as the container sees them.
func (e *env) volumes(t *testing.T) {
	e.waitPod(t, ns, "volumes", startTimeout, "Running", running)
	sa := "/var/run/secrets/kubernetes.io/serviceaccount/"
	for file, want := range map[string]string{
		"/cache/f":         "written\n",
		"/config/greeting": "hello from a configmap",
		"/secret/password": "s3cret-berth",
		sa + "namespace":   ns,
		sa + "ca.crt":      readFile(t, e.pki.caFile),
	} {
		if got := e.exec(t, ns, "volumes", "cat", file); got != want {
			t.Errorf("%s in the pod: %q, want %q", file, got, want)
		}
	}
	if token := e.exec(t, ns, "volumes", "cat", sa+"token"); strings.Count(token, ".") != 2 {
		t.Errorf("service account token %q is not a JWT", token)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// probes: a failing liveness probe restarts the container (counted), a
// readiness probe keeps a pod out of Ready until it passes.
func (e *env) probes(t *testing.T) {
	e.waitPod(t, ns, "liveness", startTimeout, "restarted by its liveness probe", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
	})
	p := e.waitPod(t, ns, "gated", startTimeout, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if ready(p) {
		t.Fatalf("gated is Ready before its readiness file exists: %s", describe(p))
	}
	time.Sleep(3 * time.Second)
	if p = e.pod(t, ns, "gated"); ready(p) {
		t.Fatalf("gated turned Ready without its readiness file: %s", describe(p))
	}
	e.exec(t, ns, "gated", "touch", "/tmp/ready")
	e.waitPod(t, ns, "gated", 30*time.Second, "Ready once the probe passes", ready)
}

// oom: a container over its memory limit is OOMKilled, and shown so.
func (e *env) oom(t *testing.T) {
	p := e.waitPod(t, ns, "oom", startTimeout, "terminated", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Terminated != nil
	})
	if r := p.Status.ContainerStatuses[0].State.Terminated.Reason; r != "OOMKilled" {
		t.Errorf("oom terminated with reason %q, want OOMKilled: %s", r, describe(p))
	}
}

// hostAccess: a hostPort reaches the pod on its node's address, from the
// host, and on the node's own loopback; a hostNetwork pod serves on its
// node's loopback.
func (e *env) hostAccess(t *testing.T) {
	p := e.waitPod(t, ns, "hostport", startTimeout, "Running", running)
	n := e.nodeOf(t, p)
	for _, from := range []struct {
		what string
		get  func(string) (string, error)
		host string
	}{{"the host", kubeenv.Get, n.ip}, {n.name, n.get, "127.0.0.1"}} {
		url := fmt.Sprintf("http://%s:%d/", from.host, e.hostPort)
		kubeenv.WaitFor(t, 20*time.Second, "GET "+url+" from "+from.what, func() (bool, string) {
			body, err := from.get(url)
			return err == nil && body == "v1 hostport\n", fmt.Sprintf("%q %v", body, err)
		})
	}
	p = e.waitPod(t, ns, "hostnet", startTimeout, "Running", running)
	n = e.nodeOf(t, p)
	url := fmt.Sprintf("http://127.0.0.1:%d/", e.hostNetPort)
	kubeenv.WaitFor(t, 20*time.Second, "GET "+url+" on "+n.name, func() (bool, string) {
		body, err := n.get(url)
		return err == nil && strings.HasPrefix(body, "v1 "), fmt.Sprintf("%q %v", body, err)
	})
}

// security: RuntimeDefault seccomp filters the container (the others run
// unconfined, the kubelet's default), hostUsers: false maps root to an
// unprivileged host range.
func (e *env) security(t *testing.T) {
	e.waitPod(t, ns, "seccomp", startTimeout, "Running", running)
	if got := e.exec(t, ns, "seccomp", "grep", "^Seccomp:", "/proc/self/status"); strings.Fields(got)[1] != "2" {
		t.Errorf("seccomp pod: %q, want mode 2 (filter)", got)
	}
	if got := e.exec(t, ns, "client", "grep", "^Seccomp:", "/proc/self/status"); strings.Fields(got)[1] != "0" {
		t.Errorf("unconfined pod: %q, want mode 0", got)
	}
	p := e.waitPod(t, ns, "userns", startTimeout, "Running", running)
	var inside, host, length uint64
	m := e.exec(t, ns, "userns", "cat", "/proc/self/uid_map")
	if n, _ := fmt.Sscan(m, &inside, &host, &length); n != 3 || inside != 0 || host == 0 || length != 65536 {
		t.Errorf("uid_map of the hostUsers: false pod: %q, want container 0 mapped to a 65536-ID host range", m)
	}
	if id := e.exec(t, ns, "userns", "id", "-u"); id != "0\n" {
		t.Errorf("id -u in the hostUsers: false pod: %q, want 0", id)
	}
	// On its node, the container's root is the first ID of that range.
	pid := e.nodeOf(t, p).containerPID(t, string(p.UID))
	status := readFile(t, fmt.Sprintf("/proc/%d/status", pid))
	if _, uids, _ := strings.Cut(status, "\nUid:"); len(strings.Fields(uids)) == 0 || strings.Fields(uids)[0] != fmt.Sprint(host) {
		t.Errorf("the hostUsers: false container's process %d on %s has host UIDs %.40q, want %d", pid, p.Spec.NodeName, uids, host)
	}
}

// limits: the pod's requests and limits are in its container's cgroup,
// below its node's kubelet's cgroup root.
func (e *env) limits(t *testing.T) {
	p := e.waitPod(t, ns, "limits", startTimeout, "Running", running)
	if p.Status.QOSClass != corev1.PodQOSBurstable {
		t.Errorf("QoS class %s, want Burstable", p.Status.QOSClass)
	}
	n := e.nodeOf(t, p)
	pid := n.containerPID(t, string(p.UID))
	v2 := n.cgroups.V2()
	podCg := n.cgroups.Root + "/kubepods/burstable/pod" + string(p.UID)
	cg := kubeenv.ProcCgroup(t, pid, "memory", v2)
	if !strings.HasPrefix(cg, podCg+"/") {
		t.Fatalf("container process %d is in cgroup %s, not below the pod's %s", pid, cg, podCg)
	}
	if v2 {
		kubeenv.ExpectFile(t, "", cg, "memory.max", strconv.Itoa(64<<20))
		kubeenv.ExpectFile(t, "", cg, "cpu.max", "25000 100000")
		return
	}
	kubeenv.ExpectFile(t, "memory", cg, "memory.limit_in_bytes", strconv.Itoa(64<<20))
	kubeenv.ExpectFile(t, "cpu", kubeenv.ProcCgroup(t, pid, "cpu", v2), "cpu.cfs_quota_us", "25000")
	kubeenv.ExpectFile(t, "cpu", kubeenv.ProcCgroup(t, pid, "cpu", v2), "cpu.shares", "102")
}

// resize: an in-place resize (kubectl patch --subresource resize) reaches the
// running container's cgroup without a restart, and berth records the pod's
// new pod-level resources (UpdatePodSandboxResources).
func (e *env) resize(t *testing.T) {
	e.kubectl(t, "-n", ns, "patch", "pod", "limits", "--subresource", "resize", "--patch",
		`{"spec":{"containers":[{"name":"main","resources":{"requests":{"cpu":"100m","memory":"32Mi"},"limits":{"cpu":"500m","memory":"96Mi"}}}]}}`)
	p := e.waitPod(t, ns, "limits", time.Minute, "resized to 500m and 96Mi", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].Resources != nil && cs[0].Resources.Limits.Memory().Value() == 96<<20 &&
			cs[0].Resources.Limits.Cpu().MilliValue() == 500
	})
	if n := p.Status.ContainerStatuses[0].RestartCount; n != 0 {
		t.Errorf("the resize restarted the container (%d restarts)", n)
	}
	n := e.nodeOf(t, p)
	pid := n.containerPID(t, string(p.UID))
	v2 := n.cgroups.V2()
	cg := kubeenv.ProcCgroup(t, pid, "memory", v2)
	if v2 {
		kubeenv.ExpectFile(t, "", cg, "memory.max", strconv.Itoa(96<<20))
		kubeenv.ExpectFile(t, "", cg, "cpu.max", "50000 100000")
	} else {
		kubeenv.ExpectFile(t, "memory", cg, "memory.limit_in_bytes", strconv.Itoa(96<<20))
		kubeenv.ExpectFile(t, "cpu", kubeenv.ProcCgroup(t, pid, "cpu", v2), "cpu.cfs_quota_us", "50000")
	}
	sandboxes := n.sandboxes(t, string(p.UID))
	if len(sandboxes) != 1 {
		t.Fatalf("pod %s has %d sandboxes in berth, want 1", p.UID, len(sandboxes))
	}
	r, err := n.rt.PodSandboxStatus(kubeenv.Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxes[0].Id, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	// protojson writes an int64 as a string.
	if want := fmt.Sprintf(`"memoryLimitInBytes":"%d"`, 96<<20); !strings.Contains(r.Info["info"], want) {
		t.Errorf("berth's record of the pod has no %s: %.600s", want, r.Info["info"])
	}
}
