package cri

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestRequestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, conn := startServer(t, ServerOptions{Runtime: NewRuntimeService(Config{}, nil, nil),
		Extension: NewExtensionServer(fakeImporter{}), Metrics: reg})
	ctx := context.Background()
	for range 2 {
		if _, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewExtensionClient(conn).Import(ctx, &runtimeapi.ImageSpec{Image: "relative"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Import(relative) = %v", err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "berth_cri_request_duration_seconds" {
			continue
		}
		for _, m := range f.Metric {
			var method, code string
			for _, l := range m.Label {
				switch l.GetName() {
				case "method":
					method = l.GetValue()
				case "code":
					code = l.GetValue()
				}
			}
			counts[method+" "+code] = m.GetHistogram().GetSampleCount()
		}
	}
	if counts["Version OK"] != 2 || counts["Import InvalidArgument"] != 1 || len(counts) != 2 {
		t.Errorf("request counts = %v, want Version OK 2, Import InvalidArgument 1", counts)
	}
}

func TestRequestSubject(t *testing.T) {
	got := requestSubject(&runtimeapi.CreateContainerRequest{PodSandboxId: "p1",
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "web"}, Image: &runtimeapi.ImageSpec{Image: "nginx"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "web-0", Namespace: "shop"}}})
	want := []any{"pod_id", "p1", "pod", "web-0", "namespace", "shop", "container", "web", "image", "nginx"}
	if !slices.Equal(got, want) {
		t.Errorf("CreateContainer subject = %v, want %v", got, want)
	}
	got = requestSubject(&runtimeapi.StopContainerRequest{ContainerId: "c1"})
	if !slices.Equal(got, []any{"container_id", "c1"}) {
		t.Errorf("StopContainer subject = %v", got)
	}
}
