package cri

import (
	"path"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// requestMetrics is berth_cri_request_duration_seconds: one histogram per
// CRI method and gRPC code, so its _count is the calls (and the errors, by
// code) and its buckets the latencies.
type requestMetrics struct {
	duration *prometheus.HistogramVec
}

// requestBuckets span a cached list call (~100 µs) to a long image pull.
var requestBuckets = prometheus.ExponentialBuckets(0.0001, 4, 12) // 100 µs … ~7 min

func newRequestMetrics(reg prometheus.Registerer) *requestMetrics {
	if reg == nil {
		return nil
	}
	m := &requestMetrics{duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_cri_request_duration_seconds",
		Help:    "Duration of CRI (and berth extension) calls by method and gRPC code.",
		Buckets: requestBuckets,
	}, []string{"method", "code"})}
	reg.MustRegister(m.duration)
	return m
}

// observe records one call; fullMethod is gRPC's "/runtime.v1.RuntimeService/Version".
func (m *requestMetrics) observe(fullMethod string, start time.Time, err error) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(path.Base(fullMethod), status.Code(err).String()).Observe(time.Since(start).Seconds())
}
