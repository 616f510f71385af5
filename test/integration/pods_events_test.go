package integration

import (
	"context"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerEvents: GetContainerEvents brings each change of a pod and
// of its containers, in order, each with the pod's status and its
// containers' statuses as they were right after it: the pod's run, a
// container's create, start, exit (code and time, without a status call
// reaching the shim) and removal, the pod's stop and removal.
func TestContainerEvents(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	stream, err := e.d.Runtime.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil { // subscribed
		t.Fatal(err)
	}
	next := func(what string, typ runtimeapi.ContainerEventType, id string) *runtimeapi.ContainerEventResponse {
		t.Helper()
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ev.ContainerEventType != typ || ev.ContainerId != id || ev.PodSandboxStatus == nil || ev.CreatedAt == 0 {
			t.Fatalf("%s: event %v %s (pod status %v), want %v %s", what, ev.ContainerEventType, ev.ContainerId, ev.PodSandboxStatus, typ, id)
		}
		return ev
	}

	cfg := e.podConfig("events")
	pod := e.runPod(t, cfg)
	next("pod created", runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, pod)
	ev := next("pod started", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, pod)
	if ev.PodSandboxStatus.Id != pod || ev.PodSandboxStatus.State != runtimeapi.PodSandboxState_SANDBOX_READY ||
		ev.PodSandboxStatus.Metadata.GetUid() != cfg.Metadata.Uid {
		t.Errorf("pod started: pod status %v", ev.PodSandboxStatus)
	}

	ctr := e.create(t, pod, cfg, e.ctrConfig("exits", "/bin/sh", "-c", "sleep 0.2; exit 5"))
	ev = next("container created", runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, ctr)
	if len(ev.ContainersStatuses) != 1 || ev.ContainersStatuses[0].State != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Errorf("container created: statuses %v", ev.ContainersStatuses)
	}
	e.start(t, ctr)
	ev = next("container started", runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, ctr)
	if st := ev.ContainersStatuses; len(st) != 1 || st[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING || st[0].StartedAt == 0 ||
		st[0].User.GetLinux() == nil {
		t.Errorf("container started: statuses %v, want running with its user", st)
	}
	ev = next("container stopped", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, ctr)
	if st := ev.ContainersStatuses; len(st) != 1 || st[0].State != runtimeapi.ContainerState_CONTAINER_EXITED ||
		st[0].ExitCode != 5 || st[0].FinishedAt == 0 || st[0].Reason != "Error" {
		t.Errorf("container stopped: statuses %v", st)
	}
	if _, err := e.d.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	ev = next("container deleted", runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, ctr)
	if len(ev.ContainersStatuses) != 0 {
		t.Errorf("container deleted: statuses %v, want none", ev.ContainersStatuses)
	}

	if _, err := e.d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	ev = next("pod stopped", runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, pod)
	if ev.PodSandboxStatus.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("pod stopped: pod state %v", ev.PodSandboxStatus.State)
	}
	e.removePod(t, pod)
	ev = next("pod deleted", runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, pod)
	if ev.PodSandboxStatus.Metadata.GetUid() != cfg.Metadata.Uid {
		t.Errorf("pod deleted: pod status %v, want the pod's last", ev.PodSandboxStatus)
	}
	e.assertNoLeaks(t)
}
