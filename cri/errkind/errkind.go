// Package errkind names the kinds of failure a CRI caller can act on. The
// code that knows the cause (image, sandbox, network, a validator) marks its
// error with a kind; cri maps kinds to gRPC codes in one place. An error
// with no kind is the runtime's own fault and answers Internal.
//
// It is a leaf package: every layer may import it, it imports no layer.
package errkind

import (
	"errors"
	"fmt"
)

// Kind is a failure kind; errors.Is(err, kind) tells whether err has it.
type Kind struct{ name string }

func (k *Kind) Error() string { return k.name }

// The kinds, each answered with the gRPC code of the same name.
var (
	Invalid            = &Kind{"invalid argument"}
	NotFound           = &Kind{"not found"}
	AlreadyExists      = &Kind{"already exists"}
	FailedPrecondition = &Kind{"failed precondition"}
	ResourceExhausted  = &Kind{"resource exhausted"}
	DeadlineExceeded   = &Kind{"deadline exceeded"}
	Unauthenticated    = &Kind{"unauthenticated"}
)

// Errorf returns an error of kind k whose message is the kind then the
// formatted text ("not found: pod x"). %w in format wraps as fmt.Errorf does.
func Errorf(k *Kind, format string, args ...any) error {
	return &kinded{kind: k, err: fmt.Errorf(format, args...), prefix: true}
}

// New returns a sentinel error of kind k with msg as its whole message, for
// a package's own named errors (image.ErrNotFound).
func New(k *Kind, msg string) error {
	return &kinded{kind: k, err: errors.New(msg)}
}

type kinded struct {
	kind   *Kind
	err    error
	prefix bool
}

func (e *kinded) Error() string {
	if e.prefix {
		return e.kind.name + ": " + e.err.Error()
	}
	return e.err.Error()
}

// Unwrap exposes both the kind and what the message wrapped.
func (e *kinded) Unwrap() []error { return []error{e.kind, e.err} }
