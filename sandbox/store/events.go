package store

import (
	"sync"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Event kinds, as GetContainerEvents names them. A pod's own events (run,
// stopped or lost, removed) carry the pod's ID as the container's, as the
// kubelet's evented PLEG expects.
const (
	EventContainerCreated = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
	EventContainerStarted = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
	EventContainerStopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
	EventContainerDeleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
)

// Event is one change, with the pod and its containers as they were right
// after it.
type Event struct {
	Type        runtimeapi.ContainerEventType
	ContainerID string
	At          time.Time
	Pod         *Pod
	Containers  []*ContainerStatus
}

// SubscriberBuffer is how many events a subscriber may have unread before
// it is dropped: the runtime never waits for a subscriber.
const SubscriberBuffer = 1024

// Subscription receives every event from its start until Close, or until
// it fell SubscriberBuffer events behind: C is then closed and Err says so.
type Subscription struct {
	C   <-chan Event
	ch  chan Event
	hub *eventHub
	err error // set before ch is closed
}

// Err is why C was closed.
func (s *Subscription) Err() error { return s.err }

// Close ends the subscription.
func (s *Subscription) Close() { s.hub.drop(s, nil) }

type eventHub struct {
	mu   sync.Mutex
	subs map[*Subscription]bool
}

// Subscribe starts a subscription to every pod and container event.
func (s *Store) Subscribe() *Subscription {
	ch := make(chan Event, SubscriberBuffer)
	sub := &Subscription{C: ch, ch: ch, hub: &s.events}
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	if s.events.subs == nil {
		s.events.subs = map[*Subscription]bool{}
	}
	s.events.subs[sub] = true
	return sub
}

func (h *eventHub) drop(s *Subscription, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[s] {
		delete(h.subs, s)
		s.err = err
		close(s.ch)
	}
}

// send hands ev to every subscriber without waiting: one whose buffer is
// full is dropped.
func (h *eventHub) send(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		select {
		case s.ch <- ev:
		default:
			delete(h.subs, s)
			s.err = errkind.Errorf(errkind.ResourceExhausted, "event subscriber dropped: it left %d events unread", SubscriberBuffer)
			close(s.ch)
		}
	}
}

// Publish tells subscribers of a change to pod podID or its container
// ctrID; a pod that is gone already has nothing to report.
func (s *Store) Publish(kind runtimeapi.ContainerEventType, podID, ctrID string) {
	pod, err := s.view.pod(podID)
	if err != nil {
		return
	}
	s.PublishPod(kind, pod, ctrID)
}

// PublishPod is Publish for a pod already read (or removed).
func (s *Store) PublishPod(kind runtimeapi.ContainerEventType, pod *Pod, ctrID string) {
	if !s.events.any() {
		return
	}
	ev := Event{Type: kind, ContainerID: ctrID, At: time.Now(), Pod: pod, Containers: s.view.listStatuses(Filter{PodID: pod.ID})}
	s.events.send(ev)
}

func (h *eventHub) any() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) > 0
}
