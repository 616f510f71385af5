package integration

import (
	"context"
	"encoding/hex"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// collector is an in-process OTLP/gRPC trace collector.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *collector) named(name string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// children are the names of the spans whose parent is p.
func (c *collector) children(p *tracepb.Span) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, s := range c.spans {
		if slices.Equal(s.ParentSpanId, p.SpanId) && slices.Equal(s.TraceId, p.TraceId) {
			out = append(out, s.Name)
		}
	}
	return out
}

func startCollector(t *testing.T) (*collector, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return c, ln.Addr().String()
}

// TestTracingToOTLPCollector: with [tracing] endpoint set, each CRI call is
// a server span and each start phase a child of its call's span, exported
// to the collector.
func TestTracingToOTLPCollector(t *testing.T) {
	c, addr := startCollector(t)
	e := startPodEnvTOML(t, v1.Config{}, "[tracing]\nendpoint = \"http://"+addr+"\"\n")
	cfg := e.podConfig("traced")
	pod := e.runPod(t, cfg)
	e.runContainer(t, pod, cfg, e.ctrConfig("app", sleeper...))

	want := map[string][]string{
		"/runtime.v1.RuntimeService/RunPodSandbox":   {"namespaces", "network", "cgroup", "files", "shim"},
		"/runtime.v1.RuntimeService/CreateContainer": {"rootfs", "spec", "create"},
		"/runtime.v1.RuntimeService/StartContainer":  {"start"},
		"/runtime.v1.ImageService/PullImage":         {"pull"},
	}
	ok := eventually(20*time.Second, func() bool {
		for call := range want {
			if len(c.named(call)) == 0 {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("spans of the calls did not reach the collector; got %d spans", len(c.spans))
	}
	for call, phases := range want {
		s := c.named(call)[0]
		if s.Kind != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("%s: kind %v, want server", call, s.Kind)
		}
		kids := c.children(s)
		for _, ph := range phases {
			if !slices.Contains(kids, ph) {
				t.Errorf("%s: children %v lack %s", call, kids, ph)
			}
		}
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestNoTracingWithoutEndpoint: without [tracing] nothing is exported and
// berthd says nothing about tracing; without [metrics] no endpoint listens.
func TestNoTracingWithoutEndpoint(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	if strings.Contains(e.d.Logs(), "tracing") {
		t.Errorf("berthd mentions tracing without an endpoint:\n%s", e.d.Logs())
	}
	if !regexp.MustCompile(`msg="berthd serving" .*metrics="" `).MatchString(e.d.Logs()) {
		t.Errorf("berthd serves metrics without [metrics] address:\n%s", e.d.Logs())
	}
	out, err := e.d.Berthctl("info")
	if err != nil || !strings.Contains(out, "metrics:        off\n") {
		t.Errorf("berthctl info = %v:\n%s", err, out)
	}
}

// TestTracingSamplingFollowsCaller: with sampling_rate = 0 berthd records
// no trace of its own, but a call whose caller sampled its trace (a tracing
// kubelet's traceparent) is recorded, as a child of the caller's span.
func TestTracingSamplingFollowsCaller(t *testing.T) {
	harness.RequireIntegration(t)
	c, addr := startCollector(t)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: "[tracing]\nendpoint = \"http://" + addr + "\"\nsampling_rate = 0\n"})
	if _, err := d.Runtime.Version(t.Context(), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := d.Runtime.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	const call = "/runtime.v1.RuntimeService/Version"
	if !eventually(20*time.Second, func() bool { return len(c.named(call)) > 0 }) {
		t.Fatal("the call in the caller's sampled trace did not reach the collector")
	}
	spans := c.named(call)
	if len(spans) != 1 || hex.EncodeToString(spans[0].TraceId) != traceID || hex.EncodeToString(spans[0].ParentSpanId) != parentID {
		t.Fatalf("Version spans %v: want one, in trace %s under span %s (the unsampled call recorded nothing)", spans, traceID, parentID)
	}
}
