package cri

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// OpenTelemetry's global tracer: a no-op unless berthd set up tracing.
var tracer = otel.Tracer("github.com/berth-runtime/berth/cri")

// startCallSpan starts a server span for one CRI call, as a child of the
// caller's trace when it sent one (a tracing kubelet sends traceparent).
func startCallSpan(ctx context.Context, method string) (context.Context, trace.Span) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = propagation.TraceContext{}.Extract(ctx, metadataCarrier(md))
	}
	return tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", method)))
}

func endCallSpan(span trace.Span, err error) {
	st := status.Convert(err)
	span.SetAttributes(attribute.String("rpc.grpc.status_code", st.Code().String()))
	if err != nil {
		span.SetStatus(otelcodes.Error, st.Message())
	}
	span.End()
}

// metadataCarrier reads W3C trace context from gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
