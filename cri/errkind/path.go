package errkind

import (
	"errors"
	"fmt"
	"syscall"
)

// Default returns err as it is when it has a kind already, else marked
// with k: for a step whose failures are the caller's (k) unless the code
// that knew better said otherwise.
func Default(k *Kind, err error) error {
	var known *Kind
	if errors.As(err, &known) {
		return err
	}
	return Errorf(k, "%w", err)
}

// pathKinds: a path the caller named that cannot name anything is the
// caller's fault; a filesystem that refuses root or fails is the node's,
// which the operator must mend (a retry alone may not do).
var pathKinds = []struct {
	kind   *Kind
	errnos []syscall.Errno
}{
	{Invalid, []syscall.Errno{syscall.ENOENT, syscall.ENOTDIR, syscall.ELOOP, syscall.ENAMETOOLONG}},
	{FailedPrecondition, []syscall.Errno{syscall.EACCES, syscall.EPERM, syscall.EIO, syscall.ESTALE,
		syscall.ENOTCONN, syscall.EHOSTDOWN, syscall.EHOSTUNREACH, syscall.ENXIO, syscall.ENODEV}},
	{DeadlineExceeded, []syscall.Errno{syscall.ETIMEDOUT}},
}

// PathErrorf formats an error about a path the caller named that could not
// be looked at because of cause, with the kind cause calls for. A cause of
// no such kind (ENOSPC, ENOMEM: mapped by errno) gets none.
func PathErrorf(cause error, format string, args ...any) error {
	for _, pk := range pathKinds {
		for _, e := range pk.errnos {
			if errors.Is(cause, e) {
				return Errorf(pk.kind, format, args...)
			}
		}
	}
	return fmt.Errorf(format, args...)
}
