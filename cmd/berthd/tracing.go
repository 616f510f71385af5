package main

import (
	"context"
	"log/slog"
	"net/url"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/berth-runtime/berth/cmd/berthd/config"
	"github.com/berth-runtime/berth/cri"
)

// exportEvery is how long finished spans wait to be sent in a batch.
const exportEvery = 2 * time.Second

// setupTracing makes OpenTelemetry's global tracer provider export spans
// (CRI calls, start phases, pulls) to [tracing] endpoint over OTLP/gRPC.
// Without an endpoint it does nothing: the packages' tracers stay no-ops.
// The returned stop flushes what is left.
func setupTracing(cfg config.Tracing, log *slog.Logger) (stop func(), err error) {
	if cfg.Endpoint == "" {
		return func() {}, nil
	}
	u, err := url.Parse(cfg.Endpoint) // validated with the config
	if err != nil {
		return nil, err
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(u.Host)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	// The exporter connects lazily and retries: a collector that is down
	// costs spans, never berthd's start.
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(exportEvery)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRate))),
		sdktrace.WithResource(resource.NewSchemaless(
			attribute.String("service.name", "berthd"), attribute.String("service.version", cri.RuntimeVersion))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	log.Info("tracing to OTLP collector", "endpoint", cfg.Endpoint, "sampling_rate", cfg.SamplingRate)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: spans not flushed at stop", "err", err)
		}
	}, nil
}
