package integration

import (
	"errors"
	"io"
	"regexp"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

const metricsTOML = "[metrics]\naddress = \"127.0.0.1:0\"\n"

// metricsAddr is where berthd serves /metrics, from its last start log.
func metricsAddr(t *testing.T, e *podEnv) string {
	t.Helper()
	m := regexp.MustCompile(`metrics=(127\.0\.0\.1:\d+)`).FindAllStringSubmatch(e.d.Logs(), -1)
	if m == nil {
		t.Fatalf("berthd did not log its metrics address:\n%s", e.d.Logs())
	}
	return m[len(m)-1][1]
}

// scrape reads the endpoint in the text format: series (name with its
// labels as printed, sorted) → value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	m, err := harness.ScrapeMetrics(addr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMetricsEndpoint scrapes berthd after a pull, a pod with a running
// container, a container killed for memory and a failed call, and checks
// that each moved the series that count it.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	e := startPodEnvTOML(t, v1.Config{}, metricsTOML) // pulls the test image
	addr := metricsAddr(t, e)

	m := scrape(t, addr)
	for _, s := range []string{
		`berth_image_pull_duration_seconds_count{result="success"}`,
		`berth_image_pull_bytes_total`,
		`berth_image_layers_total{result="unpacked"}`,
		`berth_images`,
		`berth_images_size_bytes`,
		`berth_cri_request_duration_seconds_count{code="OK",method="PullImage"}`,
	} {
		if m[s] <= 0 {
			t.Errorf("after a pull: %s = %v, want > 0", s, m[s])
		}
	}
	if m[`berth_pods{state="SANDBOX_READY"}`] != 0 || m[`berth_shims`] != 0 {
		t.Errorf("before any pod: pods ready %v, shims %v", m[`berth_pods{state="SANDBOX_READY"}`], m[`berth_shims`])
	}
	// An image with the same layer and another config unpacks nothing.
	unpacked := m[`berth_image_layers_total{result="unpacked"}`]
	e.pushImage(t, "berth/busybox:reused", v1.Config{Env: []string{"REUSED=1"}})
	m = scrape(t, addr)
	if m[`berth_image_layers_total{result="reused"}`] != 1 || m[`berth_images`] != 2 ||
		m[`berth_image_layers_total{result="unpacked"}`] != unpacked {
		t.Errorf("after a pull of the same layer: reused %v, images %v, unpacked %v (was %v); want 1, 2 and no more unpacked",
			m[`berth_image_layers_total{result="reused"}`], m[`berth_images`], m[`berth_image_layers_total{result="unpacked"}`], unpacked)
	}

	cfg := e.podConfig("metrics")
	pod := e.runPod(t, cfg)
	sleeperID := e.runContainer(t, pod, cfg, e.ctrConfig("sleeper", sleeper...))
	hog := e.ctrConfig("hog", "/bin/sh", "-c", "x=$(/bin/busybox head -c 67108864 /dev/zero | /bin/busybox tr '\\0' a)")
	hog.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}}
	if st, _ := e.runToExit(t, pod, cfg, hog); st.Reason != "OOMKilled" {
		t.Fatalf("hog ended %s (%d), want OOMKilled", st.Reason, st.ExitCode)
	}
	_, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: "0123456789"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("StartContainer(unknown) = %v", err)
	}
	_, err = e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: sleeperID})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("StartContainer(running) = %v", err)
	}

	m = scrape(t, addr)
	want := map[string]float64{
		`berth_pods{state="SANDBOX_READY"}`:           1,
		`berth_containers{state="CONTAINER_RUNNING"}`: 1,
		`berth_containers{state="CONTAINER_EXITED"}`:  1,
		`berth_shims`:           1,
		`berth_oom_kills_total`: 1,
		`berth_cri_request_duration_seconds_count{code="OK",method="RunPodSandbox"}`:                  1,
		`berth_cri_request_duration_seconds_count{code="OK",method="StartContainer"}`:                 2,
		`berth_cri_request_duration_seconds_count{code="NotFound",method="StartContainer"}`:           1,
		`berth_cri_request_duration_seconds_count{code="FailedPrecondition",method="StartContainer"}`: 1,
	}
	for s, v := range want {
		if m[s] != v {
			t.Errorf("%s = %v, want %v", s, m[s], v)
		}
	}
	for _, phase := range []string{"namespaces", "network", "cgroup", "files", "shim"} {
		if s := `berth_start_phase_duration_seconds_count{object="pod",phase="` + phase + `"}`; m[s] != 1 {
			t.Errorf("%s = %v, want 1", s, m[s])
		}
	}
	for _, phase := range []string{"rootfs", "spec", "create", "start"} {
		if s := `berth_start_phase_duration_seconds_count{object="container",phase="` + phase + `"}`; m[s] != 2 {
			t.Errorf("%s = %v, want 2", s, m[s])
		}
	}
	if m[`berth_shims_memory_bytes`] < 1<<20 {
		t.Errorf("berth_shims_memory_bytes = %v, want a live shim's resident memory", m[`berth_shims_memory_bytes`])
	}
	if m[`process_resident_memory_bytes`] <= 0 {
		t.Error("berthd's own process series are missing")
	}
	// The failed calls' log lines name what they were about: the ID the
	// call carried and, for a container berthd has, its and its pod's names.
	if !eventually(5*time.Second, func() bool {
		return regexp.MustCompile(`msg="cri call".*method=/runtime.v1.RuntimeService/StartContainer.*code=NotFound.*container_id=0123456789`).MatchString(e.d.Logs())
	}) {
		t.Errorf("no log line for the failed StartContainer with its container ID")
	}
	named := regexp.MustCompile(`msg="cri call".*method=/runtime.v1.RuntimeService/StartContainer.*code=FailedPrecondition.*container_id=` +
		sleeperID + ` container=sleeper pod=metrics namespace=default`)
	if !eventually(5*time.Second, func() bool { return named.MatchString(e.d.Logs()) }) {
		t.Errorf("no log line for the failed StartContainer naming the container and its pod")
	}
	e.removePod(t, pod)
	m = scrape(t, addr)
	if m[`berth_pods{state="SANDBOX_READY"}`] != 0 || m[`berth_shims`] != 0 || m[`berth_oom_kills_total`] != 1 {
		t.Errorf("after removal: pods ready %v, shims %v, oom kills %v (a counter: stays 1)",
			m[`berth_pods{state="SANDBOX_READY"}`], m[`berth_shims`], m[`berth_oom_kills_total`])
	}

	// A restart finds the pod it had and counts it recovered.
	pod = e.runPod(t, cfg)
	e.d.Restart()
	m = scrape(t, metricsAddr(t, e))
	if m[`berth_recovered_pods_total{result="reconnected"}`] != 1 || m[`berth_shims`] != 1 {
		t.Errorf("after a restart with one pod: recovered %v, shims %v; want 1 and 1",
			m[`berth_recovered_pods_total{result="reconnected"}`], m[`berth_shims`])
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestCRIMetrics: what `crictl metricdescs` and `crictl metricsp` show, as
// the kubelet's /metrics/cadvisor replacement reads it: every metric has a
// descriptor with as many label keys as it has values, and the container
// series carry the pod, namespace and container names.
func TestCRIMetrics(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	keys := e.metricLabelKeys(t)
	for _, n := range []string{"container_cpu_usage_seconds_total", "container_memory_working_set_bytes", "container_memory_usage_bytes",
		"container_memory_rss", "container_memory_cache", "container_oom_events_total", "container_processes",
		"container_fs_usage_bytes", "container_network_receive_bytes_total", "container_network_transmit_bytes_total"} {
		if keys[n] == nil {
			t.Errorf("no descriptor for %s", n)
		}
	}

	cfg := e.podConfig("crimetrics")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("worker", sleeper...))
	list, err := e.d.Runtime.ListPodSandboxMetrics(t.Context(), &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.PodMetrics) != 1 || list.PodMetrics[0].PodSandboxId != pod {
		t.Fatalf("ListPodSandboxMetrics = %v, want pod %s", list.PodMetrics, pod)
	}
	pm := list.PodMetrics[0]
	labelled := func(m *runtimeapi.Metric) map[string]string {
		k := keys[m.Name]
		if len(k) != len(m.LabelValues) {
			t.Fatalf("%s: %d label values for %d keys", m.Name, len(m.LabelValues), len(k))
		}
		out := map[string]string{}
		for i := range k {
			out[k[i]] = m.LabelValues[i]
		}
		return out
	}
	rx := false
	for _, m := range pm.Metrics {
		l := labelled(m)
		if m.Name == "container_network_receive_bytes_total" && l["interface"] == "eth0" && l["pod"] == "crimetrics" {
			rx = true
		}
	}
	if !rx {
		t.Errorf("no eth0 receive counter for the pod in %v", pm.Metrics)
	}
	if len(pm.ContainerMetrics) != 1 || pm.ContainerMetrics[0].ContainerId != ctr {
		t.Fatalf("container metrics = %v, want container %s", pm.ContainerMetrics, ctr)
	}
	values := map[string]uint64{}
	for _, m := range pm.ContainerMetrics[0].Metrics {
		l := labelled(m)
		if l["pod"] != "crimetrics" || l["namespace"] != cfg.Metadata.Namespace || l["container"] != "worker" || l["id"] != ctr {
			t.Errorf("%s labels = %v", m.Name, l)
		}
		values[m.Name] = m.Value.GetValue()
	}
	// Right after StartContainer, runc's init (several threads) may still
	// be exec'ing the process: the count settles within the collector's
	// period.
	eventually(5*time.Second, func() bool {
		if values["container_processes"] == 1 {
			return true
		}
		list, err := e.d.Runtime.ListPodSandboxMetrics(t.Context(), &runtimeapi.ListPodSandboxMetricsRequest{})
		if err != nil || len(list.PodMetrics) != 1 || len(list.PodMetrics[0].ContainerMetrics) != 1 {
			t.Fatalf("ListPodSandboxMetrics = %v, %v; want one pod with one container", list, err)
		}
		for _, m := range list.PodMetrics[0].ContainerMetrics[0].Metrics {
			values[m.Name] = m.Value.GetValue()
		}
		return false
	})
	if values["container_memory_working_set_bytes"] == 0 || values["container_processes"] != 1 {
		t.Errorf("working set %d, processes %d: want > 0 and 1", values["container_memory_working_set_bytes"], values["container_processes"])
	}

	stream, err := e.d.Runtime.StreamPodSandboxMetrics(t.Context(), &runtimeapi.StreamPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var streamed []string
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.PodSandboxMetrics {
			streamed = append(streamed, p.PodSandboxId)
		}
	}
	if len(streamed) != 1 || streamed[0] != pod {
		t.Errorf("StreamPodSandboxMetrics gave pods %v, want %s", streamed, pod)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// metricLabelKeys is ListMetricDescriptors as a map of each metric's name
// to its label keys.
func (e *podEnv) metricLabelKeys(t *testing.T) map[string][]string {
	t.Helper()
	descs, err := e.d.Runtime.ListMetricDescriptors(t.Context(), &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for _, d := range descs.Descriptors {
		keys[d.Name] = d.LabelKeys
	}
	return keys
}
