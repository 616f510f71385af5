package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
)

// metrics are the sandbox manager's Prometheus series: start phases as they
// happen, recoveries at start, and the state of pods, containers and shims
// read at every scrape (collect), so they never drift from the records.
type metrics struct {
	phases     *prometheus.HistogramVec
	recoveries *prometheus.CounterVec

	pods, containers, shims, shimMemory, oomKills *prometheus.Desc

	mu      sync.Mutex
	oomSeen map[string]bool // containers counted in berth_oom_kills_total, until removed
	ooms    uint64
}

// phaseBuckets span a namespace pin (~100 µs) to a slow network attach.
var phaseBuckets = prometheus.ExponentialBuckets(0.0001, 3, 12) // 100 µs … ~18 s

func newMetrics(reg prometheus.Registerer, m *Manager) *metrics {
	if reg == nil {
		return nil
	}
	x := &metrics{
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_start_phase_duration_seconds",
			Help:    "Duration of each phase of a pod (RunPodSandbox) or container (CreateContainer, StartContainer) start.",
			Buckets: phaseBuckets,
		}, []string{"object", "phase"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_recovered_pods_total",
			Help: "Pods found at berthd's start, by what became of them: reconnected to their shim, lost (shim gone, pod made NOTREADY) or unresponsive (shim does not answer, pod left as it is).",
		}, []string{"result"}),
		pods:       prometheus.NewDesc("berth_pods", "Pod sandboxes by state.", []string{"state"}, nil),
		containers: prometheus.NewDesc("berth_containers", "Containers by state.", []string{"state"}, nil),
		shims:      prometheus.NewDesc("berth_shims", "Pod shims alive.", nil, nil),
		shimMemory: prometheus.NewDesc("berth_shims_memory_bytes", "Resident memory of all pod shims together.", nil, nil),
		oomKills: prometheus.NewDesc("berth_oom_kills_total",
			"Containers berthd saw ended by the kernel's OOM killer since it started.", nil, nil),
		oomSeen: map[string]bool{},
	}
	reg.MustRegister(x.phases, x.recoveries, &stateCollector{m: m, x: x})
	return x
}

// observeTimeline records the phases of one start; object is "pod" or "container".
func (x *metrics) observeTimeline(object string, steps []store.Step) {
	if x == nil {
		return
	}
	for _, s := range steps {
		x.phases.WithLabelValues(object, s.Name).Observe(s.Duration.Seconds())
	}
}

func (x *metrics) recovered(result string) {
	if x != nil {
		x.recoveries.WithLabelValues(result).Inc()
	}
}

// sawOOM counts container id in berth_oom_kills_total the first time its
// state changes to stopped by the OOM killer.
func (x *metrics) sawOOM(id string) {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.oomSeen[id] {
		x.oomSeen[id] = true
		x.ooms++
	}
}

// forget drops a removed container from the OOM bookkeeping.
func (x *metrics) forget(id string) {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.oomSeen, id)
}

func (x *metrics) oomKillCount() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ooms
}

// stateCollector reads the records and the shims at scrape time.
type stateCollector struct {
	m *Manager
	x *metrics
}

// collectTimeout bounds a scrape's shim calls: a wedged shim must not hang
// the metrics endpoint.
const collectTimeout = 10 * time.Second

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.x.pods, s.x.containers, s.x.shims, s.x.shimMemory, s.x.oomKills} {
		ch <- d
	}
}

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	pods, err := s.m.ListPods(store.Filter{})
	if err != nil {
		s.m.log.Warn("metrics: list pods", "err", err)
		return
	}
	byState := map[string]float64{}
	for _, st := range runtimeapi.PodSandboxState_name {
		byState[st] = 0
	}
	for _, p := range pods {
		byState[p.State.String()]++
	}
	for st, n := range byState {
		ch <- prometheus.MustNewConstMetric(s.x.pods, prometheus.GaugeValue, n, st)
	}

	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	ctrs, err := s.m.ListContainers(ctx, store.Filter{})
	if err != nil {
		s.m.log.Warn("metrics: list containers", "err", err)
	} else {
		byState = map[string]float64{}
		for _, st := range runtimeapi.ContainerState_name {
			byState[st] = 0
		}
		for _, c := range ctrs {
			byState[c.State.String()]++
		}
		for st, n := range byState {
			ch <- prometheus.MustNewConstMetric(s.x.containers, prometheus.GaugeValue, n, st)
		}
	}
	ch <- prometheus.MustNewConstMetric(s.x.oomKills, prometheus.CounterValue, float64(s.x.oomKillCount()))

	alive, rss := s.m.shimUsage()
	ch <- prometheus.MustNewConstMetric(s.x.shims, prometheus.GaugeValue, float64(alive))
	ch <- prometheus.MustNewConstMetric(s.x.shimMemory, prometheus.GaugeValue, float64(rss))
}

// shimUsage counts the shims berthd is connected to and sums their
// resident memory, read from /proc by the pid each shim wrote.
func (m *Manager) shimUsage() (alive int, rss uint64) {
	m.mu.Lock()
	ids := make([]string, 0, len(m.shims))
	for id := range m.shims {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		b, err := os.ReadFile(filepath.Join(m.podDir(id), shim.PidFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
		if err != nil {
			continue
		}
		n, ok := residentBytes(pid)
		if !ok {
			continue // exited since
		}
		alive++
		rss += n
	}
	return alive, rss
}

// residentBytes is a process's VmRSS.
func residentBytes(pid int) (uint64, bool) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			kb, err := strconv.ParseUint(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
