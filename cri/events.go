package cri

import (
	"github.com/berth-runtime/berth/sandbox/store"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// GetContainerEvents streams every pod and container event from now on,
// each with the pod's status and its containers' as they were right after
// it. A client that leaves store.SubscriberBuffer events unread is
// dropped: the stream ends with ResourceExhausted saying so (the kubelet
// then relists), and the runtime never waits for it.
func (r *RuntimeService) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	sub := r.pods.Subscribe()
	defer sub.Close()
	// The header tells the client its subscription is in place: events
	// from then on reach it.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case ev, ok := <-sub.C:
			if !ok {
				return grpcError(sub.Err())
			}
			if err := stream.Send(containerEvent(ev)); err != nil {
				return err
			}
		}
	}
}

func containerEvent(ev store.Event) *runtimeapi.ContainerEventResponse {
	resp := &runtimeapi.ContainerEventResponse{
		ContainerId: ev.ContainerID, ContainerEventType: ev.Type, CreatedAt: ev.At.UnixNano(),
		PodSandboxStatus: podSandboxStatus(ev.Pod),
	}
	for _, c := range ev.Containers {
		resp.ContainersStatuses = append(resp.ContainersStatuses, containerStatus(c))
	}
	return resp
}
