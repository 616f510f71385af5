package server

import (
	"github.com/berth-runtime/berth/sandbox/shim"
)

// keptEvents is how many past events the shim keeps for a berthd that
// asks after a pause (its call is parked again within milliseconds; one
// that missed more gets a snapshot).
const keptEvents = 256

// eventLog is the shim's recent container events. Their numbers start
// after 1, the shim's start: a berthd asking after 0 always gets a
// snapshot, and one asking after the snapshot's number waits.
type eventLog struct {
	seq    uint64
	events []shim.Event  // the last keptEvents, the newest last
	wake   chan struct{} // closed and replaced at each event
}

func newEventLog() *eventLog { return &eventLog{seq: 1, wake: make(chan struct{})} }

// emit records what happened to a container; s.mu is held.
func (s *Server) emit(kind string, st shim.State) {
	l := s.events
	l.seq++
	l.events = append(l.events, shim.Event{Kind: kind, State: st})
	if len(l.events) > keptEvents {
		l.events = l.events[len(l.events)-keptEvents:]
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

// nextEvents answers an EventsRequest: the events after req.After once
// there are any, a snapshot for After 0 or a gap, or Quit.
func (s *Server) nextEvents(req *shim.EventsRequest) shim.EventsReply {
	for {
		s.mu.Lock()
		l := s.events
		oldest := l.seq - uint64(len(l.events)) // seq of the event before the oldest kept
		switch {
		case req.After == 0 || req.After < oldest || req.After > l.seq:
			r := shim.EventsReply{Seq: l.seq, Snapshot: true}
			for _, c := range s.ctrs {
				r.Events = append(r.Events, shim.Event{Kind: shim.EventState, State: c.state})
			}
			s.mu.Unlock()
			return r
		case req.After < l.seq:
			r := shim.EventsReply{Seq: l.seq, Events: append([]shim.Event(nil), l.events[len(l.events)-int(l.seq-req.After):]...)}
			s.mu.Unlock()
			return r
		}
		wake := l.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-s.quit:
			return shim.EventsReply{Seq: req.After, Quit: true}
		}
	}
}
