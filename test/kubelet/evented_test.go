package kubelet

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
)

// eventedPod: a container that runs a few seconds, then exits 3, for good.
const eventedPod = `apiVersion: v1
kind: Pod
metadata:
  name: evented
  namespace: e2e
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: quitter
    image: IMAGE
    command: ["sh", "-c", "sleep 4; exit 3"]
`

// TestKubeletEventedPLEG runs a kubelet with the EventedPLEG feature gate:
// it takes container changes from berth's GetContainerEvents and relists
// only every 300 s, so a container's exit reaches the pod's status within
// seconds only through an event. Its metric of events received counts
// them, and the pod is taken down through berth at the end as usual. The
// same kubelet lists with the Stream* calls (CRIListStreaming).
func TestKubeletEventedPLEG(t *testing.T) {
	requireTier(t)
	e := newEnv(t, "featureGates:\n  EventedPLEG: true\n  CRIListStreaming: true\n")
	e.writeManifest("evented", eventedPod)
	e.waitPod(t, "evented", 2*time.Minute, "quitter running", func(p *corev1.Pod) bool {
		c := ctrStatus(p, "quitter")
		return c != nil && c.State.Running != nil
	})
	p := e.waitPod(t, "evented", 30*time.Second, "quitter terminated with 3, from an event", func(p *corev1.Pod) bool {
		c := ctrStatus(p, "quitter")
		return c != nil && c.State.Terminated != nil
	})
	term := ctrStatus(p, "quitter").State.Terminated
	if term.ExitCode != 3 {
		t.Errorf("quitter terminated with %d (%s), want 3", term.ExitCode, term.Reason)
	}
	t.Logf("exit seen by the kubelet %s after it happened", time.Since(term.FinishedAt.Time).Round(100*time.Millisecond))

	body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", e.readOnly))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^kubelet_evented_pleg_connection_latency_seconds_count (\d+)`).FindStringSubmatch(body)
	n := 0
	if m != nil {
		n, _ = strconv.Atoi(m[1])
	}
	if n == 0 {
		t.Errorf("the kubelet counted no container event (kubelet_evented_pleg_connection_latency_seconds_count: %q)", m)
	}
	// berthd logs every CRI call at debug: the kubelet listed with Stream*.
	log, err := os.ReadFile(e.path("berthd.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, method := range []string{"StreamPodSandboxes", "StreamContainers"} {
		if !strings.Contains(string(log), "RuntimeService/"+method+" ") {
			t.Errorf("berthd served no %s call", method)
		}
	}
	e.removeManifest("evented")
	kubeenv.WaitFor(t, 2*time.Minute, "berth has no pod left", func() (bool, string) {
		n, err := e.berthPodCount()
		return err == nil && n == 0, fmt.Sprintf("%d pods, %v", n, err)
	})
}
