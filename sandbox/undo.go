package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"golang.org/x/sys/unix"
)

// undo collects the steps that roll back a half-done operation, so a failure
// at any point leaves nothing behind, or, where a step cannot be undone,
// leaves what is left to the operation's record.
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

// undoRetryDelays are the waits before each retry of an undo step that
// failed for a passing reason (see transient): a process that leaves its
// cgroup or a file still closing takes milliseconds, and the caller's
// reply waits for them.
var undoRetryDelays = []time.Duration{20 * time.Millisecond, 80 * time.Millisecond, 320 * time.Millisecond}

// run undoes the recorded steps, last first, and returns nil once all are
// undone. A step that still fails after its retries stops the rollback
// there, and run returns its error: the steps recorded before it made what
// it undoes (the folder its mount is in, the image layers its overlay
// stacks), so undoing them first could lose or break it. The first step
// of each operation forgets its record, so a failed rollback keeps the
// record, which names what is left for the kubelet's stop and remove (or
// berthd's recovery) to finish.
func (u *undo) run() error {
	defer func() { u.steps = nil }()
	for _, s := range slices.Backward(u.steps) {
		if err := u.runStep(s); err != nil {
			u.log.Error("rollback step failed: its record keeps what is left", "op", u.op, "step", s.what, "err", err)
			return fmt.Errorf("%s: rollback step %q: %w", u.op, s.what, err)
		}
	}
	return nil
}

// runStep runs one undo step, retrying it while it fails for a passing
// reason.
func (u *undo) runStep(s undoStep) error {
	err := s.fn()
	for _, d := range undoRetryDelays {
		if !transient(err) {
			break
		}
		u.log.Warn("rollback step failed: retrying", "op", u.op, "step", s.what, "in", d, "err", err)
		time.Sleep(d)
		err = s.fn()
	}
	return err
}

// transient: the kernel said busy or try again (a cgroup whose last
// process is still leaving, a mount still referenced), which passes by
// itself. Other failures (a permission, a shim that timed out, which
// already waited its bound) would only fail again.
func transient(err error) bool {
	return errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)
}

// keep forgets the steps: the operation succeeded, and recorded it. Its
// reply may still be lost: a crash point, named point, is right after.
func (u *undo) keep(point string) {
	u.steps = nil
	crashpoint.Hit(u.op, point)
}
