package shim

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// Client talks to one pod's shim. It is safe for concurrent use; calls are
// multiplexed over one connection.
type Client struct {
	rpc    *rpcClient
	podDir string
}

// Dial connects to the shim serving podDir.
func Dial(podDir string) (*Client, error) {
	conn, err := dialSocket(podDir)
	if err != nil {
		return nil, fmt.Errorf("%w: dial shim in %s: %v", ErrUnavailable, podDir, err)
	}
	return &Client{rpc: newRPCClient(conn), podDir: podDir}, nil
}

// Close closes the connection; the shim keeps running.
func (c *Client) Close() error { return c.rpc.close() }

// Events returns the container events after after (see EventsRequest)
// once there are any. It fails with ErrUnavailable when the shim went away
// or this client was closed.
// A shim from before Events (still running after an upgrade of berth)
// answers ErrNoEvents.
func (c *Client) Events(ctx context.Context, after uint64) (EventsReply, error) {
	var r EventsReply
	if err := predates(c.call(ctx, "Events", &EventsRequest{After: after}, &r), ErrNoEvents); err != nil {
		return EventsReply{}, err
	}
	return r, nil
}

// PodDir is the pod folder this client was dialed for.
func (c *Client) PodDir() string { return c.podDir }

// call runs one RPC; ctx abandons the wait (the shim may still finish it,
// and the reply is then written later: on an error, callers must not read
// reply).
func (c *Client) call(ctx context.Context, method string, args, reply any) error {
	seq, call := c.rpc.start(ServiceName+"."+method, args, reply)
	select {
	case err := <-call.done:
		return remoteError(err)
	case <-ctx.Done():
		c.rpc.abandon(seq)
		return ctx.Err()
	}
}

// remoteError turns the text of a server error back into a sentinel; any
// other error is the transport's (reset, EOF, shut down): the shim is gone.
func remoteError(err error) error {
	if err == nil {
		return nil
	}
	var se serverError
	if !errors.As(err, &se) {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	for _, s := range remoteErrors {
		if strings.HasPrefix(string(se), s.Error()) {
			return &wireError{msg: string(se), is: s}
		}
	}
	return err
}

type wireError struct {
	msg string
	is  error
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.is }

// Info reports the shim's pid and how many containers are live.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var r Info
	if err := c.call(ctx, "Info", &Empty{}, &r); err != nil {
		return Info{}, err
	}
	return r, nil
}

// Create spawns the container's init in the created state.
func (c *Client) Create(ctx context.Context, req CreateRequest) error {
	return c.call(ctx, "Create", &req, &Empty{})
}

// CreateRestored prepares a container that Start restores from the
// checkpoint req.Restore names. A shim from before restores answers
// ErrNoRestore.
func (c *Client) CreateRestored(ctx context.Context, req CreateRequest) error {
	return predates(c.call(ctx, "CreateRestored", &req, &Empty{}), ErrNoRestore)
}

// predates is err, or, when it says that the shim does not know the call
// (a shim from before it), sentinel with it.
func predates(err, sentinel error) error {
	var se serverError
	if errors.As(err, &se) && strings.HasPrefix(string(se), unknownMethod) {
		return fmt.Errorf("%w: %v", sentinel, err)
	}
	return err
}

// Start lets a created container's process run and returns its state.
func (c *Client) Start(ctx context.Context, id string) (State, error) {
	var r State
	if err := c.call(ctx, "Start", &IDRequest{ID: id}, &r); err != nil {
		return State{}, err
	}
	return r, nil
}

// Kill signals the container's init, or all its processes. A stopped
// container is not an error.
func (c *Client) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	return c.call(ctx, "Kill", &KillRequest{ID: id, Signal: int(sig), All: all}, &Empty{})
}

// State reports a container's state, from the shim's memory or its records.
func (c *Client) State(ctx context.Context, id string) (State, error) {
	var r State
	if err := c.call(ctx, "State", &IDRequest{ID: id}, &r); err != nil {
		return State{}, err
	}
	return r, nil
}

// Wait blocks until the container stops or ctx ends. The shim is told the
// deadline, so it does not keep waiting on its side after we gave up.
func (c *Client) Wait(ctx context.Context, id string) (State, error) {
	req := WaitRequest{ID: id}
	if d, ok := ctx.Deadline(); ok {
		if req.Timeout = time.Until(d); req.Timeout <= 0 {
			return State{}, context.DeadlineExceeded
		}
	}
	var r State
	if err := c.call(ctx, "Wait", &req, &r); err != nil {
		return State{}, err
	}
	if r.Status != StatusStopped {
		return r, context.DeadlineExceeded
	}
	return r, nil
}

// Delete removes a stopped container's libcontainer state and cgroup. Its
// records (exit.json, started.json) stay for the manager to remove.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.call(ctx, "Delete", &IDRequest{ID: id}, &Empty{})
}

// Exec runs a command in the container and returns its output, up to
// MaxOutput: the rest is discarded (a shim from before that gives an error
// that matches ErrOutputTooLarge).
//
// When ctx ends first, the shim is told to kill the command: nobody reads
// its output any more.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (ExecResponse, error) {
	req.Token = rand.Text()
	var r ExecResponse
	err := c.call(ctx, "Exec", &req, &r)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		cancelCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer cancel()
		if cerr := c.call(cancelCtx, "CancelExec", &CancelRequest{Token: req.Token}, &Empty{}); cerr != nil {
			err = fmt.Errorf("%w (and the shim was not told to stop the command: %v)", err, cerr)
		}
	}
	if err != nil {
		return ExecResponse{}, err
	}
	return r, nil
}

// cancelTimeout bounds telling the shim that a caller has gone.
const cancelTimeout = 5 * time.Second

// Checkpoint has CRIU checkpoint a running container into req's folders,
// leaving it running. The shim stops the checkpoint at req.Timeout and
// thaws the container: ctx should leave it time to say so. A shim from
// before the call answers ErrNoCheckpoint.
func (c *Client) Checkpoint(ctx context.Context, req CheckpointRequest) error {
	return predates(c.call(ctx, "Checkpoint", &req, &Empty{}), ErrNoCheckpoint)
}

// ReopenLog makes the shim reopen the container's CRI log file (rotation).
func (c *Client) ReopenLog(ctx context.Context, id string) error {
	return c.call(ctx, "ReopenLog", &IDRequest{ID: id}, &Empty{})
}

// Update applies new cgroup limits to a container and records them in its
// spec.
func (c *Client) Update(ctx context.Context, req UpdateRequest) error {
	return c.call(ctx, "Update", &req, &Empty{})
}

// Shutdown makes the shim exit; it refuses (ErrBusy) while a container is
// created or running.
func (c *Client) Shutdown(ctx context.Context) error {
	err := c.call(ctx, "Shutdown", &Empty{}, &Empty{})
	if errors.Is(err, ErrUnavailable) { // it went away before the reply got out
		return nil
	}
	return err
}
