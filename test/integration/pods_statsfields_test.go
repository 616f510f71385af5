package integration

import (
	"maps"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestStatsFiguresFilled reads the stats and metrics fields that no other
// test looks at (TestCRIFields names this test for them): the CPU rate,
// memory usage, RSS and page faults, the attributes' annotations, the pod
// interface's error counters, and the CRI metrics' help, type and time.
func TestStatsFiguresFilled(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("statsfields")
	cfg.Annotations = map[string]string{"example.com/pod": "p"}
	pod := e.runPod(t, cfg)
	cc := e.ctrConfig("busy", "/bin/sh", "-c", "while :; do :; done")
	cc.Annotations = map[string]string{"example.com/ctr": "c"}
	// A fifth of a CPU: busy enough for a rate, light on a shared host.
	cc.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuQuota: 20000, CpuPeriod: 100000}}
	ctr := e.runContainer(t, pod, cfg, cc)

	// The rate needs two samples of the collector, a period apart.
	var st *runtimeapi.ContainerStats
	if !eventually(30*time.Second, func() bool {
		st = containerStats(t, e, ctr)
		return st.GetCpu().GetUsageNanoCores().GetValue() > 0
	}) {
		t.Fatalf("container stats %v: no CPU rate within 30 s of a busy loop", st)
	}
	m := st.GetMemory()
	if m.GetUsageBytes().GetValue() == 0 || m.GetRssBytes().GetValue() == 0 || m.GetPageFaults().GetValue() == 0 || m.GetMajorPageFaults() == nil {
		t.Errorf("memory %v: want usage, RSS and page faults > 0, and major page faults counted", m)
	}
	if m.AvailableBytes != nil {
		t.Errorf("memory %v: available bytes without a memory limit", m)
	}
	if a := st.GetAttributes().GetAnnotations(); !maps.Equal(a, cc.Annotations) {
		t.Errorf("container attributes' annotations %v, want %v", a, cc.Annotations)
	}
	ps := podSandboxStats(t, e, pod)
	if a := ps.GetAttributes().GetAnnotations(); !maps.Equal(a, cfg.Annotations) {
		t.Errorf("pod attributes' annotations %v, want %v", a, cfg.Annotations)
	}
	if eth0 := ps.GetLinux().GetNetwork().GetDefaultInterface(); eth0.GetRxErrors() == nil || eth0.GetTxErrors() == nil {
		t.Errorf("pod interface %v: want its error counters", eth0)
	}

	descs, err := e.d.Runtime.ListMetricDescriptors(t.Context(), &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range descs.Descriptors {
		if d.Help == "" {
			t.Errorf("descriptor %s has no help", d.Name)
		}
	}
	list, err := e.d.Runtime.ListPodSandboxMetrics(t.Context(), &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil || len(list.GetPodMetrics()) != 1 || len(list.PodMetrics[0].GetContainerMetrics()) != 1 {
		t.Fatalf("ListPodSandboxMetrics = %v, %v; want one pod with one container", list, err)
	}
	pm := list.PodMetrics[0]
	for _, metric := range append(pm.Metrics, pm.ContainerMetrics[0].Metrics...) {
		// Counters are the cumulative ones; container_fs_inodes_total is
		// cadvisor's name for a gauge, container_memory_failcnt its name
		// for a counter.
		want := runtimeapi.MetricType_GAUGE
		if strings.HasSuffix(metric.Name, "_total") && metric.Name != "container_fs_inodes_total" || metric.Name == "container_memory_failcnt" {
			want = runtimeapi.MetricType_COUNTER
		}
		if metric.MetricType != want {
			t.Errorf("metric %s: type %s, want %s", metric.Name, metric.MetricType, want)
		}
	}
	// The container's figures are the collector's sample and carry its
	// time; the network's are read on request, which time 0 says to the
	// kubelet.
	for _, metric := range pm.ContainerMetrics[0].Metrics {
		if ts := time.Unix(0, metric.Timestamp); time.Since(ts) > time.Minute || ts.After(time.Now()) {
			t.Errorf("metric %s: time %v, want the sample's, within the last minute", metric.Name, ts)
		}
	}
	for _, metric := range pm.Metrics {
		if metric.Timestamp != 0 {
			t.Errorf("network metric %s: time %d, want 0 (read on request)", metric.Name, metric.Timestamp)
		}
	}
	e.removePod(t, pod)
}
