package nri

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics counts what plugins do: how many are connected, and their
// failed requests (a plugin that crashed or timed out fails the one it
// was answering, and is dropped).
type metrics struct {
	plugins prometheus.Gauge
	errors  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) adaptation.Metrics {
	m := &metrics{
		plugins: prometheus.NewGauge(prometheus.GaugeOpts{Name: "berth_nri_plugins",
			Help: "NRI plugins connected and registered."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_nri_plugin_errors_total",
			Help: "NRI plugin requests that failed (refusals, crashes, timeouts), by plugin and request."},
			[]string{"plugin", "operation"}),
	}
	if reg != nil {
		reg.MustRegister(m.plugins, m.errors)
	}
	return m
}

func (m *metrics) RecordPluginInvocation(plugin, op string, err error) {
	if err != nil {
		m.errors.WithLabelValues(plugin, op).Inc()
	}
}

func (m *metrics) RecordPluginLatency(string, string, time.Duration) {}

func (m *metrics) RecordPluginAdjustments(string, string, *adaptation.ContainerAdjustment, int, int) {
}

func (m *metrics) UpdatePluginCount(n int) { m.plugins.Set(float64(n)) }

// logger puts the NRI library's log lines in berthd's log.
type logger struct{ l *slog.Logger }

func (g logger) Debugf(ctx context.Context, f string, a ...any) { g.log(ctx, slog.LevelDebug, f, a) }
func (g logger) Infof(ctx context.Context, f string, a ...any)  { g.log(ctx, slog.LevelInfo, f, a) }
func (g logger) Warnf(ctx context.Context, f string, a ...any)  { g.log(ctx, slog.LevelWarn, f, a) }
func (g logger) Errorf(ctx context.Context, f string, a ...any) { g.log(ctx, slog.LevelError, f, a) }

func (g logger) log(ctx context.Context, level slog.Level, f string, a []any) {
	g.l.Log(ctx, level, "NRI: "+fmt.Sprintf(f, a...))
}
