package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestPodConcurrency runs, checks and removes 10 pods at the same time, as
// the kubelet's pod workers do: every call succeeds, each pod gets what it
// asked for, and nothing is left.
func TestPodConcurrency(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	const n = 10
	rt := e.d.Runtime

	// parallel runs fn for pods 0..n-1 at once and reports their errors.
	parallel := func(t *testing.T, fn func(ctx context.Context, i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = fn(t.Context(), i) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("pod %d: %v", i, err)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	// start runs pod i of a round with a container, and checks it from inside.
	start := func(ctx context.Context, round string, i int) (string, error) {
		cfg := e.podConfig(fmt.Sprintf("%s-%d", round, i))
		pod, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			return "", fmt.Errorf("RunPodSandbox: %w", err)
		}
		c, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, SandboxConfig: cfg,
			Config: e.ctrConfig("c", sleeper...)})
		if err != nil {
			return "", fmt.Errorf("CreateContainer: %w", err)
		}
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
			return "", fmt.Errorf("StartContainer: %w", err)
		}
		r, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: c.ContainerId, Cmd: []string{"/bin/hostname"}, Timeout: 30})
		if err != nil || string(r.Stdout) != cfg.Hostname+"\n" {
			return "", fmt.Errorf("ExecSync hostname: %q, %v; want %s", r.GetStdout(), err, cfg.Hostname)
		}
		return pod.PodSandboxId, nil
	}
	remove := func(ctx context.Context, pod string) error {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
			return fmt.Errorf("StopPodSandbox: %w", err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
			return fmt.Errorf("RemovePodSandbox: %w", err)
		}
		return nil
	}

	t.Run("all-up-then-all-down", func(t *testing.T) {
		pods := make([]string, n)
		parallel(t, func(ctx context.Context, i int) (err error) {
			pods[i], err = start(ctx, "batch", i)
			return err
		})
		if got := e.listPodIDs(t, &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}); !sameSet(got, pods) {
			t.Errorf("ready pods = %v, want %v", got, pods)
		}
		running := e.listContainerIDs(t, &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
		if len(running) != n {
			t.Errorf("%d running containers, want %d", len(running), n)
		}
		parallel(t, func(ctx context.Context, i int) error { return remove(ctx, pods[i]) })
		for _, pod := range pods {
			assertPodGone(t, e.d, pod)
		}
		e.assertNoLeaks(t)
	})

	t.Run("interleaved", func(t *testing.T) {
		parallel(t, func(ctx context.Context, i int) error {
			pod, err := start(ctx, "mixed", i)
			if err != nil {
				return err
			}
			return remove(ctx, pod)
		})
		e.assertNoLeaks(t)
	})
}
