package cri

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
)

// TestGRPCError: the kind the code that knew the cause chose is the code,
// however deep it is wrapped; the node running out of space or memory is
// ResourceExhausted wherever it showed; anything else, a permission error
// of a mount or a namespace included, is berth's own fault (Internal), not
// the caller's (audit finding 14).
func TestGRPCError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{errkind.Errorf(errkind.Invalid, "config.log_path %q", "../x"), codes.InvalidArgument},
		{fmt.Errorf("create container: %w", errkind.Errorf(errkind.FailedPrecondition, "pod not ready")), codes.FailedPrecondition},
		{fmt.Errorf("image x: layer y was removed: %w", image.ErrNotFound), codes.NotFound},
		{errkind.Errorf(errkind.AlreadyExists, "pod"), codes.AlreadyExists},
		{errkind.Errorf(errkind.DeadlineExceeded, "stop"), codes.DeadlineExceeded},
		{errkind.Errorf(errkind.Unauthenticated, "registry"), codes.Unauthenticated},
		{fmt.Errorf("pull: %w", context.Canceled), codes.Canceled},
		{fmt.Errorf("pod files: %w", &fs.PathError{Op: "write", Path: "/run/x/hosts", Err: syscall.ENOSPC}), codes.ResourceExhausted},
		{fmt.Errorf("rootfs: %w", os.NewSyscallError("mount", syscall.EDQUOT)), codes.ResourceExhausted},
		{fmt.Errorf("namespaces: %w", os.NewSyscallError("unshare", syscall.EPERM)), codes.Internal},
		{fmt.Errorf("pod files: %w", os.NewSyscallError("mount", syscall.EINVAL)), codes.Internal},
		{fmt.Errorf("image lookup: %w", fmt.Errorf("bolt: database not open")), codes.Internal},
	} {
		got := grpcError(c.err)
		if s, _ := status.FromError(got); s.Code() != c.want || s.Message() != c.err.Error() {
			t.Errorf("grpcError(%v) = %v %q, want %v with the error's message", c.err, s.Code(), s.Message(), c.want)
		}
	}
}
