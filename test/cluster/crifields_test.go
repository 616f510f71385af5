package cluster

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// kubeletAsks: what the kubelet asks of berth beyond running a container,
// each seen from kubectl's side: a DRA driver's device, kubectl debug
// --target, a container's stop signal, an unmasked /proc in a user
// namespace, and the resources in the container status across a resize.
// They run side by side.
func (e *env) kubeletAsks(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"DRA", e.dra},
		{"DebugTarget", e.debugTarget},
		{"StopSignal", e.stopSignal},
		{"ProcMountUnmasked", e.procMountUnmasked},
		{"StatusResources", e.statusResources},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t)
		})
	}
}

const debugeeYAML = `apiVersion: v1
kind: Pod
metadata: {name: debugee, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: IMAGE
    command: ["sleep", "3617"]
`

// debugTarget: kubectl debug --target puts an ephemeral container in the
// app container's PID namespace (the pod shares none), so that it sees the
// app's sleep 3617; in a namespace of its own it would see only itself.
func (e *env) debugTarget(t *testing.T) {
	e.apply(t, debugeeYAML)
	e.waitPod(t, ns, "debugee", startTimeout, "Running", running)
	e.kubectl(t, "debug", "-n", ns, "debugee", "--image", e.imageV1, "--target", "app", "-c", "dbg", "--", "sleep", "3600")
	e.waitPod(t, ns, "debugee", startTimeout, "with its debug container running", func(p *corev1.Pod) bool {
		cs := p.Status.EphemeralContainerStatuses
		return len(cs) == 1 && cs[0].State.Running != nil
	})
	ps := e.kubectl(t, "exec", "-n", ns, "debugee", "-c", "dbg", "--", "ps", "-o", "pid,args")
	if !strings.Contains(ps, "sleep 3617") || !strings.Contains(ps, "sleep 3600") {
		t.Errorf("ps in the debug container: %q, want the app's sleep 3617 beside its own sleep 3600", ps)
	}
	e.kubectl(t, "delete", "-n", ns, "pod/debugee", "--wait=false")
}

const stopSignalYAML = `apiVersion: v1
kind: Pod
metadata: {name: stopsignal, namespace: e2e}
spec:
  os: {name: linux}
  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: IMAGE
    command: ["sh", "-c", "trap 'echo got USR1 > /marker/signal; exit 0' USR1; while true; do sleep 1; done"]
    lifecycle: {stopSignal: SIGUSR1}
    volumeMounts: [{name: marker, mountPath: /marker}]
  volumes:
  - {name: marker, hostPath: {path: MARKER, type: DirectoryOrCreate}}
`

// stopSignal: lifecycle.stopSignal SIGUSR1 (the ContainerStopSignals gate)
// shows in the container status, and deleting the pod sends SIGUSR1: the
// shell, PID 1 with no handler for SIGTERM, would ignore the default signal
// and be killed after the grace period without writing its marker.
func (e *env) stopSignal(t *testing.T) {
	marker := e.path("stopsignal")
	e.apply(t, strings.ReplaceAll(stopSignalYAML, "MARKER", marker))
	p := e.waitPod(t, ns, "stopsignal", startTimeout, "Running", running)
	if s := p.Status.ContainerStatuses[0].StopSignal; s == nil || *s != corev1.SIGUSR1 {
		t.Errorf("containerStatuses[0].stopSignal %s, want SIGUSR1", signalName(s))
	}
	start := time.Now()
	e.kubectl(t, "delete", "-n", ns, "pod/stopsignal", "--timeout", "2m")
	b, err := os.ReadFile(marker + "/signal")
	if err != nil || string(b) != "got USR1\n" {
		t.Errorf("the container's trap on delete (after %s): %q %v, want it to have caught SIGUSR1",
			time.Since(start).Round(time.Second), b, err)
	}
}

func signalName(s *corev1.Signal) string {
	if s == nil {
		return "none"
	}
	return string(*s)
}

const unmaskedYAML = `apiVersion: v1
kind: Pod
metadata: {name: unmasked, namespace: e2e}
spec:
  hostUsers: false
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    securityContext: {procMount: Unmasked}
`

// procMountScript prints the masked or read-only /proc mounts among two of
// the kubelet's Default lists (in every kernel, unlike /proc/kcore or
// /proc/sysrq-trigger), then the kind of /proc/timer_list: a
// character device where /dev/null is bound over it. (Its content is
// root's alone, which a user namespace's root is not.)
const procMountScript = `awk '$5 ~ "^/proc/(timer_list|sys)$" {print $5}' /proc/self/mountinfo | sort; stat -c %F /proc/timer_list`

// procMountUnmasked: procMount Unmasked in a hostUsers: false pod gets a
// /proc with nothing masked or read-only (the kubelet sends empty lists);
// the Default userns pod beside it has them.
func (e *env) procMountUnmasked(t *testing.T) {
	e.apply(t, unmaskedYAML)
	e.waitPod(t, ns, "unmasked", startTimeout, "Running", running)
	if got := e.exec(t, ns, "unmasked", "sh", "-c", procMountScript); got != "regular empty file\n" {
		t.Errorf("procMount Unmasked: %q, want no masked or read-only mount and /proc/timer_list proc's own file", got)
	}
	e.waitPod(t, ns, "userns", startTimeout, "Running", running)
	if got := e.exec(t, ns, "userns", "sh", "-c", procMountScript); got != "/proc/sys\n/proc/timer_list\ncharacter special file\n" {
		t.Errorf("procMount Default: %q, want /proc/sys read-only and /proc/timer_list masked by /dev/null", got)
	}
	e.kubectl(t, "delete", "-n", ns, "pod/unmasked", "--wait=false")
}

// statusResources: kubectl get pod -o yaml shows the container's requests
// and limits in its status, the same as its spec, and after a resize the
// new ones (the limits pod, which the InPlaceResize step resized already).
// The kubelet shows berth's ContainerStatus.resources where berth reports
// them and its own allocation where not, so this catches values berth
// reports wrong or stale (a record UpdateContainerResources left behind
// keeps the old limits here, and the resize in progress for good), not
// their absence (TestStatusFields in the integration tests sees that).
func (e *env) statusResources(t *testing.T) {
	p := e.podYAML(t, "limits")
	if err := sameResources(p); err != nil {
		t.Errorf("before the resize: %v", err)
	}
	e.kubectl(t, "-n", ns, "patch", "pod", "limits", "--subresource", "resize", "--patch",
		`{"spec":{"containers":[{"name":"main","resources":{"limits":{"cpu":"750m","memory":"128Mi"}}}]}}`)
	var err error
	deadline := time.Now().Add(time.Minute)
	for {
		p = e.podYAML(t, "limits")
		lim := p.Spec.Containers[0].Resources.Limits
		if err = sameResources(p); err == nil && lim.Cpu().MilliValue() == 750 && lim.Memory().Value() == 128<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resize to 750m and 128Mi not in the status within a minute: %v (conditions %+v)", err, p.Status.Conditions)
		}
		time.Sleep(time.Second)
	}
	if n := p.Status.ContainerStatuses[0].RestartCount; n != 0 {
		t.Errorf("the resizes restarted the container (%d restarts)", n)
	}
}

// podYAML is the pod as kubectl get -o yaml shows it.
func (e *env) podYAML(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := yaml.Unmarshal([]byte(e.kubectl(t, "get", "pod", "-n", ns, name, "-o", "yaml")), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// sameResources says how the first container's status resources differ
// from its spec's, nil when they match.
func sameResources(p *corev1.Pod) error {
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].Resources == nil {
		return fmt.Errorf("no resources in the container status: %+v", p.Status.ContainerStatuses)
	}
	spec, status := p.Spec.Containers[0].Resources, p.Status.ContainerStatuses[0].Resources
	for _, pair := range []struct {
		what       string
		want, have corev1.ResourceList
	}{{"requests", spec.Requests, status.Requests}, {"limits", spec.Limits, status.Limits}} {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			want, have := pair.want[r], pair.have[r]
			if want.Cmp(have) != 0 {
				return fmt.Errorf("status %s %s = %s, spec %s", pair.what, r, have.String(), want.String())
			}
		}
	}
	return nil
}
