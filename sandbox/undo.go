package sandbox

import (
	"log/slog"
	"slices"

	"github.com/berth-runtime/berth/cri/crashpoint"
)

// undo collects the steps that roll back a half-done operation, so a failure
// at any point leaves nothing behind.
type undo struct {
	log   *slog.Logger
	op    string // the operation, naming its crash points
	steps []undoStep
}

type undoStep struct {
	what string
	fn   func() error
}

// add records how to undo the step just done. Right after a step is where a
// crash leaves the most behind: each is a crash point, named after its undo
// (run pod: remove namespace pins).
func (u *undo) add(what string, fn func() error) {
	u.steps = append(u.steps, undoStep{what, fn})
	crashpoint.Hit(u.op, what)
}

// run undoes every recorded step, last first, logging (not returning) what
// fails: the caller is already returning the original error.
func (u *undo) run() {
	for _, s := range slices.Backward(u.steps) {
		if err := s.fn(); err != nil {
			u.log.Error("rollback step failed", "step", s.what, "err", err)
		}
	}
	u.steps = nil
}

// keep forgets the steps: the operation succeeded.
func (u *undo) keep() { u.steps = nil }
