package cri

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/berth-runtime/berth/cri/errkind"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kindCodes answers each error kind with its gRPC code, first match wins.
var kindCodes = []struct {
	kind error
	code codes.Code
}{
	{errkind.Invalid, codes.InvalidArgument},
	{errkind.NotFound, codes.NotFound},
	{errkind.AlreadyExists, codes.AlreadyExists},
	{errkind.FailedPrecondition, codes.FailedPrecondition},
	{errkind.ResourceExhausted, codes.ResourceExhausted},
	{errkind.Unauthenticated, codes.Unauthenticated},
	{errkind.DeadlineExceeded, codes.DeadlineExceeded},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
	// The node is out of space, memory or descriptors, wherever it showed.
	{syscall.ENOSPC, codes.ResourceExhausted},
	{syscall.EDQUOT, codes.ResourceExhausted},
	{syscall.ENOMEM, codes.ResourceExhausted},
	{syscall.EMFILE, codes.ResourceExhausted},
}

// grpcError is the one place an error becomes a gRPC status: the kind the
// code that knew the cause gave it, or Internal when it has none.
func grpcError(err error) error {
	for _, kc := range kindCodes {
		if errors.Is(err, kc.kind) {
			return status.Error(kc.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// imageError names the request field a bad image reference came from.
func imageError(field string, err error) error {
	if field != "" && errors.Is(err, errkind.Invalid) {
		err = fmt.Errorf("%s: %w", field, err)
	}
	return grpcError(err)
}
