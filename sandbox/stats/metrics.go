package stats

import (
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/store"
)

// Metrics are the sandbox's Prometheus series: start phases as they
// happen, recoveries at start, and the state of pods, containers and shims
// read at every scrape (collect), so they never drift from the records.
// A nil *Metrics takes every observation and keeps none.
type Metrics struct {
	phases     *prometheus.HistogramVec
	recoveries *prometheus.CounterVec

	pods, containers, shims, shimMemory, oomKills *prometheus.Desc

	mu      sync.Mutex
	oomSeen map[string]bool // containers counted in berth_oom_kills_total, until removed
	ooms    uint64
}

// phaseBuckets span a namespace pin (~100 µs) to a slow network attach.
var phaseBuckets = prometheus.ExponentialBuckets(0.0001, 3, 12) // 100 µs … ~18 s

// ShimUsage counts the pod shims alive and sums their resident memory.
type ShimUsage func() (alive int, rss uint64)

// NewMetrics registers the series with reg; nil: none, and a nil *Metrics.
// The state series read st and shims at each scrape.
func NewMetrics(reg prometheus.Registerer, st *store.Store, shims ShimUsage, log *slog.Logger) *Metrics {
	if reg == nil {
		return nil
	}
	x := &Metrics{
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
	reg.MustRegister(x.phases, x.recoveries, &stateCollector{store: st, shims: shims, log: log, x: x})
	return x
}

// ObserveTimeline records the phases of one start; object is "pod" or "container".
func (x *Metrics) ObserveTimeline(object string, steps []store.Step) {
	if x == nil {
		return
	}
	for _, s := range steps {
		x.phases.WithLabelValues(object, s.Name).Observe(s.Duration.Seconds())
	}
}

// Recovered counts a pod found at berthd's start, by what became of it
// ("reconnected", "lost", "unresponsive").
func (x *Metrics) Recovered(result string) {
	if x != nil {
		x.recoveries.WithLabelValues(result).Inc()
	}
}

// SawOOM counts container id in berth_oom_kills_total the first time its
// state changes to stopped by the OOM killer.
func (x *Metrics) SawOOM(id string) {
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

// Forget drops a removed container from the OOM bookkeeping.
func (x *Metrics) Forget(id string) {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.oomSeen, id)
}

func (x *Metrics) oomKillCount() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ooms
}

// stateCollector reads the records and the shims at scrape time.
type stateCollector struct {
	store *store.Store
	shims ShimUsage
	log   *slog.Logger
	x     *Metrics
}

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.x.pods, s.x.containers, s.x.shims, s.x.shimMemory, s.x.oomKills} {
		ch <- d
	}
}

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	pods, err := s.store.ListPods(store.Filter{})
	if err != nil {
		s.log.Warn("metrics: list pods", "err", err)
		return
	}
	podStates := make([]string, len(pods))
	for i, p := range pods {
		podStates[i] = p.State.String()
	}
	sendByState(ch, s.x.pods, runtimeapi.PodSandboxState_name, podStates)

	ctrs, err := s.store.ListStatuses(store.Filter{})
	if err != nil {
		s.log.Warn("metrics: list containers", "err", err)
	} else {
		ctrStates := make([]string, len(ctrs))
		for i, c := range ctrs {
			ctrStates[i] = c.State.String()
		}
		sendByState(ch, s.x.containers, runtimeapi.ContainerState_name, ctrStates)
	}
	ch <- prometheus.MustNewConstMetric(s.x.oomKills, prometheus.CounterValue, float64(s.x.oomKillCount()))

	alive, rss := s.shims()
	ch <- prometheus.MustNewConstMetric(s.x.shims, prometheus.GaugeValue, float64(alive))
	ch <- prometheus.MustNewConstMetric(s.x.shimMemory, prometheus.GaugeValue, float64(rss))
}

// sendByState sends desc's gauge per state of names (every state, zero
// when none is in it), counting states.
func sendByState(ch chan<- prometheus.Metric, desc *prometheus.Desc, names map[int32]string, states []string) {
	count := make(map[string]float64, len(names))
	for _, name := range names {
		count[name] = 0
	}
	for _, st := range states {
		count[st]++
	}
	for st, n := range count {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, n, st)
	}
}
