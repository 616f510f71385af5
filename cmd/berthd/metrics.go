package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsEndpoint serves a registry's series on /metrics at an address of
// [metrics]. Its registry is berthd's own, not client_golang's global one:
// only what berthd registers is served.
type metricsEndpoint struct {
	reg *prometheus.Registry
	srv *http.Server
	ln  net.Listener
}

// newMetricsEndpoint listens on addr; "" gives an endpoint whose Registerer
// is nil (the packages then keep no series) and that serves nothing.
func newMetricsEndpoint(addr string) (*metricsEndpoint, error) {
	if addr == "" {
		return &metricsEndpoint{}, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return &metricsEndpoint{reg: reg, ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}, nil
}

// Registerer is where the packages register their series; nil when off.
func (e *metricsEndpoint) Registerer() prometheus.Registerer {
	if e.reg == nil {
		return nil
	}
	return e.reg
}

func (e *metricsEndpoint) Addr() string {
	if e.ln == nil {
		return ""
	}
	return e.ln.Addr().String()
}

func (e *metricsEndpoint) serve(log *slog.Logger) {
	if e.srv == nil {
		return
	}
	if err := e.srv.Serve(e.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("metrics endpoint failed", "err", err)
	}
}

func (e *metricsEndpoint) close() {
	if e.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	e.srv.Shutdown(ctx) //nolint:errcheck // stopping: nothing to do about it
}
