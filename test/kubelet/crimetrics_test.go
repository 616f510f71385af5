package kubelet

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
)

const meteredPod = `apiVersion: v1
kind: Pod
metadata:
  name: metered
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: worker
    image: IMAGE
    command: ["sleep", "3600"]
`

// TestKubeletCRIMetrics runs a kubelet with PodAndContainerStatsFromCRI:
// its /metrics/cadvisor is then made from berth's ListMetricDescriptors and
// ListPodSandboxMetrics alone, and must carry the running container's
// series with the pod, namespace and container labels the default gates
// leave empty, and the pod's network counters.
func TestKubeletCRIMetrics(t *testing.T) {
	requireTier(t)
	e := newEnv(t, "featureGates:\n  PodAndContainerStatsFromCRI: true\n")
	e.writeManifest("metered", meteredPod)
	e.waitPod(t, "metered", 2*time.Minute, "worker running", func(p *corev1.Pod) bool {
		c := ctrStatus(p, "worker")
		return c != nil && c.State.Running != nil
	})
	labels := `\{[^}]*container="worker"[^}]*namespace="e2e"[^}]*pod="metered-[^"]+"[^}]*\} `
	// A container's series carry the time of berth's sample (ms) after
	// the value, as cadvisor's do.
	want := map[string]*regexp.Regexp{
		"working set":  regexp.MustCompile(`(?m)^container_memory_working_set_bytes` + labels + `[1-9]`),
		"processes":    regexp.MustCompile(`(?m)^container_processes` + labels + `1( \d+)?$`),
		"cpu":          regexp.MustCompile(`(?m)^container_cpu_usage_seconds_total` + labels + `\d`),
		"pod received": regexp.MustCompile(`(?m)^container_network_receive_bytes_total\{[^}]*interface="eth0"[^}]*namespace="e2e"[^}]*pod="metered-[^"]+"[^}]*\} \d`),
	}
	kubeenv.WaitFor(t, time.Minute, "the worker's series on the kubelet's /metrics/cadvisor", func() (bool, string) {
		body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics/cadvisor", e.readOnly))
		if err != nil {
			return false, err.Error()
		}
		for what, re := range want {
			if !re.MatchString(body) {
				return false, fmt.Sprintf("no %s series for the worker in\n%.3000s", what, body)
			}
		}
		return true, ""
	})
	e.removeManifest("metered")
	kubeenv.WaitFor(t, 2*time.Minute, "berth has no pod left", func() (bool, string) {
		n, err := e.berthPodCount()
		return err == nil && n == 0, fmt.Sprintf("%d pods, %v", n, err)
	})
}
