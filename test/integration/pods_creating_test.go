package integration

import (
	"context"
	"fmt"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestListContainersDuringCreate lists a pod's containers without pause
// while creates are under way: a container being created is CREATED (or
// not listed yet), never EXITED. A kubelet that saw a half-made container as
// exited counted a dead attempt and collected the real previous one, so
// `kubectl logs --previous` lost it (found by the cluster tier).
func TestListContainersDuringCreate(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("creating")
	pod := e.runPod(t, cfg)

	ctx, cancel := context.WithCancel(t.Context())
	seen := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			r, err := e.d.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{
				Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
			if err != nil {
				continue
			}
			for _, c := range r.Containers {
				if c.State == runtimeapi.ContainerState_CONTAINER_EXITED {
					select {
					case seen <- fmt.Sprintf("%s (%s)", c.Metadata.GetName(), c.Id):
					default:
					}
				}
			}
		}
	}()
	for i := range 5 {
		e.createContainer(t, pod, cfg, fmt.Sprintf("c%d", i), "/bin/sleep", "60")
	}
	cancel()
	<-done
	select {
	case c := <-seen:
		t.Errorf("ListContainers showed container %s EXITED while it was being created", c)
	default:
	}
}
