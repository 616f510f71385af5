package errkind

import (
	"errors"
	"io/fs"
	"testing"
)

func TestKinds(t *testing.T) {
	sentinel := New(NotFound, "image not found")
	err := Errorf(Invalid, "config.image %q: %w", "x", fs.ErrPermission)
	for _, c := range []struct {
		err     error
		is      error
		want    bool
		message string
	}{
		{sentinel, NotFound, true, "image not found"},
		{sentinel, Invalid, false, "image not found"},
		{err, Invalid, true, `invalid argument: config.image "x": permission denied`},
		{err, fs.ErrPermission, true, `invalid argument: config.image "x": permission denied`},
		{err, NotFound, false, `invalid argument: config.image "x": permission denied`},
	} {
		if got := errors.Is(c.err, c.is); got != c.want {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", c.err, c.is, got, c.want)
		}
		if c.err.Error() != c.message {
			t.Errorf("message %q, want %q", c.err.Error(), c.message)
		}
	}
	if wrapped := Errorf(NotFound, "pod: %w", sentinel); !errors.Is(wrapped, sentinel) {
		t.Errorf("%v does not wrap its sentinel", wrapped)
	}
}
