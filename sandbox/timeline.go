package sandbox

import (
	"context"
	"time"

	"github.com/berth-runtime/berth/sandbox/store"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// timeline records the duration of each start step, and traces each as a
// span of ctx's trace (OpenTelemetry's global tracer: a no-op unless berthd
// set up tracing).
type timeline struct {
	ctx   context.Context
	steps []store.Step
	last  time.Time
}

var tracer = otel.Tracer("github.com/berth-runtime/berth/sandbox")

func newTimeline(ctx context.Context) *timeline { return &timeline{ctx: ctx, last: time.Now()} }

func (t *timeline) step(name string) {
	now := time.Now()
	_, span := tracer.Start(t.ctx, name, trace.WithTimestamp(t.last))
	span.End(trace.WithTimestamp(now))
	t.steps = append(t.steps, store.Step{Name: name, Duration: now.Sub(t.last)})
	t.last = now
}

// startStep is one step of a pod's start or a container's create. Done, it
// has registered its own undo (see undo.add); its phase, where it names
// one, is timed in the timeline from the end of the phase before.
type startStep struct {
	phase string // "": timed with the next phase
	do    func() error
	skip  bool // nothing to do for this pod or container: no phase either
}

// run does steps in order until one fails, timing their phases.
func (t *timeline) run(steps []startStep) error {
	for _, s := range steps {
		if s.skip {
			continue
		}
		if err := s.do(); err != nil {
			return err
		}
		if s.phase != "" {
			t.step(s.phase)
		}
	}
	return nil
}
