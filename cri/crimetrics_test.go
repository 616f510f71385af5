package cri

import (
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/sandbox/stats"
)

// critestSeries are the series cri-tools' critest (v1.37) wants described
// and, but for the blkio ones (optional there), listed for a running
// container: cadvisor's, as the kubelet serves them.
var critestSeries = []string{
	"container_blkio_device_usage_total", "container_cpu_cfs_periods_total", "container_cpu_cfs_throttled_periods_total",
	"container_cpu_cfs_throttled_seconds_total", "container_cpu_system_seconds_total", "container_cpu_usage_seconds_total",
	"container_cpu_user_seconds_total", "container_file_descriptors", "container_fs_inodes_free", "container_fs_inodes_total",
	"container_fs_limit_bytes", "container_fs_reads_bytes_total", "container_fs_reads_total", "container_fs_usage_bytes",
	"container_fs_writes_bytes_total", "container_fs_writes_total", "container_last_seen", "container_memory_cache",
	"container_memory_failcnt", "container_memory_failures_total", "container_memory_kernel_usage", "container_memory_mapped_file",
	"container_memory_max_usage_bytes", "container_memory_rss", "container_memory_swap", "container_memory_usage_bytes",
	"container_memory_working_set_bytes", "container_network_receive_bytes_total", "container_network_receive_errors_total",
	"container_network_receive_packets_dropped_total", "container_network_receive_packets_total",
	"container_network_transmit_bytes_total", "container_network_transmit_errors_total",
	"container_network_transmit_packets_dropped_total", "container_network_transmit_packets_total", "container_oom_events_total",
	"container_processes", "container_sockets", "container_spec_cpu_period", "container_spec_cpu_shares",
	"container_spec_memory_limit_bytes", "container_spec_memory_swap_limit_bytes", "container_start_time_seconds",
	"container_threads", "container_threads_max",
}

// TestMetricTable: every series critest wants is described; a container
// whose host knows every figure carries every container series, each with
// as many label values as its descriptor has keys; one whose host knows
// none of the optional figures carries none of their series.
func TestMetricTable(t *testing.T) {
	descs, err := (&RuntimeService{}).ListMetricDescriptors(t.Context(), &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]int{}
	for _, d := range descs.Descriptors {
		if _, dup := keys[d.Name]; dup || d.Help == "" {
			t.Errorf("descriptor %s: twice, or without help", d.Name)
		}
		keys[d.Name] = len(d.LabelKeys)
	}
	for _, n := range critestSeries {
		if _, ok := keys[n]; !ok {
			t.Errorf("no descriptor for %s", n)
		}
	}

	all := &containerFigures{ContainerDetails: stats.ContainerDetails{Details: cgroups.Details{
		Stats: cgroups.Stats{Swap: cgroups.Swap{Accounted: true}},
		Spec:  cgroups.Spec{CPUQuotaMicros: 20000},
		IO:    []cgroups.DeviceIO{{Major: 8, Device: "/dev/sda"}},
		Has:   cgroups.Has{CPUSpec: true, MemorySpec: true, Pids: true, MemoryPeak: true, KernelMemory: true, SwapLimit: true},
	}}, startedAt: time.Now(), now: time.Now()}
	none := &containerFigures{}
	for _, m := range containerMetrics {
		n := 0
		m.values(all, func(_ uint64, labels ...string) {
			n++
			if got := len(criLabels) + len(labels); got != keys[m.name] {
				t.Errorf("%s: %d label values for %d keys", m.name, got, keys[m.name])
			}
		})
		if n == 0 {
			t.Errorf("%s: no value with every figure known", m.name)
		}
		n = 0
		m.values(none, func(uint64, ...string) { n++ })
		optional := map[string]bool{"container_cpu_cfs_periods_total": true, "container_cpu_cfs_throttled_periods_total": true,
			"container_cpu_cfs_throttled_seconds_total": true, "container_memory_max_usage_bytes": true, "container_memory_kernel_usage": true,
			"container_memory_swap": true, "container_memory_failcnt": true, "container_threads": true, "container_threads_max": true,
			"container_fs_reads_bytes_total": true, "container_fs_reads_total": true, "container_fs_writes_bytes_total": true,
			"container_fs_writes_total": true, "container_blkio_device_usage_total": true, "container_spec_cpu_period": true,
			"container_spec_cpu_quota": true, "container_spec_cpu_shares": true, "container_spec_memory_limit_bytes": true,
			"container_spec_memory_swap_limit_bytes": true}
		if optional[m.name] != (n == 0) {
			t.Errorf("%s: %d values with no optional figure known", m.name, n)
		}
	}
}
