package errkind

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

// TestPathErrorf: the kind of a failure to look at a path comes from its
// cause, and the cause stays reachable.
func TestPathErrorf(t *testing.T) {
	for _, c := range []struct {
		cause error
		want  *Kind
	}{
		{&fs.PathError{Op: "lstat", Path: "/x", Err: syscall.ENOENT}, Invalid},
		{syscall.ELOOP, Invalid},
		{&fs.PathError{Op: "lstat", Path: "/nfs", Err: syscall.EACCES}, FailedPrecondition},
		{syscall.EIO, FailedPrecondition},
		{syscall.ENOTCONN, FailedPrecondition},
		{syscall.ETIMEDOUT, DeadlineExceeded},
		{syscall.ENOSPC, nil},
	} {
		err := PathErrorf(c.cause, "mount /data: host_path %q: %w", "/x", c.cause)
		if !errors.Is(err, c.cause) {
			t.Errorf("%v does not wrap its cause", err)
		}
		for _, k := range []*Kind{Invalid, NotFound, AlreadyExists, FailedPrecondition, ResourceExhausted, DeadlineExceeded, Unauthenticated} {
			if got := errors.Is(err, k); got != (k == c.want) {
				t.Errorf("PathErrorf(%v) is %v: %v, want the kind %v", c.cause, k, got, c.want)
			}
		}
	}
}

// TestDefault: an error with a kind keeps it; one without gets the default.
func TestDefault(t *testing.T) {
	timeout := Errorf(DeadlineExceeded, "mount /data: hung")
	if err := Default(Invalid, timeout); err != timeout {
		t.Errorf("Default(Invalid, %v) = %v, want it unchanged", timeout, err)
	}
	if err := Default(Invalid, fmt.Errorf("spec: %w", New(NotFound, "no such device"))); !errors.Is(err, NotFound) || errors.Is(err, Invalid) {
		t.Errorf("Default(Invalid, a wrapped not-found) = %v, want it not found still", err)
	}
	plain := errors.New("mount /data: container_path must be absolute")
	if err := Default(Invalid, plain); !errors.Is(err, Invalid) || !errors.Is(err, plain) || err.Error() != "invalid argument: "+plain.Error() {
		t.Errorf("Default(Invalid, %v) = %v, want it marked invalid", plain, err)
	}
}
