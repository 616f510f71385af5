package shim

import (
	"context"
	"errors"
	"net"
	"net/rpc"
	"strings"
	"testing"
	"time"
)

// echo is a service served both ways: by ServeConn and by net/rpc.
type echo struct{ release chan struct{} }

type EchoArgs struct{ S string }
type EchoReply struct{ S string }

func (e *echo) Echo(a *EchoArgs, r *EchoReply) error { r.S = a.S; return nil }
func (e *echo) Fail(a *EchoArgs, _ *Empty) error     { return errors.New(ErrBusy.Error() + ": " + a.S) }
func (e *echo) Block(a *EchoArgs, r *EchoReply) error {
	<-e.release
	r.S = a.S
	return nil
}

func (e *echo) methods() map[string]Method {
	return map[string]Method{"Echo": NewMethod(e.Echo), "Fail": NewMethod(e.Fail), "Block": NewMethod(e.Block)}
}

// TestServeConnSpeaksNetRPC: a berthd still on net/rpc's client (one from
// before, outliving its shims or outlived by them) gets replies, server
// errors and the unknown-method answer from ServeConn as from net/rpc.
func TestServeConnSpeaksNetRPC(t *testing.T) {
	a, b := net.Pipe()
	go ServeConn(a, (&echo{}).methods())
	c := rpc.NewClient(b)
	defer c.Close()
	var r EchoReply
	if err := c.Call(ServiceName+".Echo", &EchoArgs{S: "hi"}, &r); err != nil || r.S != "hi" {
		t.Errorf("Echo = %q, %v", r.S, err)
	}
	var se rpc.ServerError
	if err := c.Call(ServiceName+".Fail", &EchoArgs{S: "x"}, &Empty{}); !errors.As(err, &se) || string(se) != ErrBusy.Error()+": x" {
		t.Errorf("Fail = %v, want the server error %q", err, ErrBusy.Error()+": x")
	}
	if err := c.Call(ServiceName+".Nope", &Empty{}, &Empty{}); !errors.As(err, &se) || !strings.HasPrefix(string(se), unknownMethod) {
		t.Errorf("Nope = %v, want net/rpc's unknown method", err)
	}
	// The connection survived the errors.
	if err := c.Call(ServiceName+".Echo", &EchoArgs{S: "again"}, &r); err != nil || r.S != "again" {
		t.Errorf("Echo after errors = %q, %v", r.S, err)
	}
}

// TestClientSpeaksNetRPC: the client works against a net/rpc server (a
// shim from before this wire code) and against ServeConn alike.
func TestClientSpeaksNetRPC(t *testing.T) {
	for _, name := range []string{"net/rpc", "ServeConn"} {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			e := &echo{release: make(chan struct{})}
			if name == "net/rpc" {
				srv := rpc.NewServer()
				if err := srv.RegisterName(ServiceName, e); err != nil {
					t.Fatal(err)
				}
				go srv.ServeConn(a)
			} else {
				go ServeConn(a, e.methods())
			}
			c := &Client{rpc: newRPCClient(b)}
			ctx := t.Context()
			var r EchoReply
			if err := c.call(ctx, "Echo", &EchoArgs{S: "hi"}, &r); err != nil || r.S != "hi" {
				t.Errorf("Echo = %q, %v", r.S, err)
			}
			if err := c.call(ctx, "Fail", &EchoArgs{S: "x"}, &Empty{}); !errors.Is(err, ErrBusy) {
				t.Errorf("Fail = %v, want ErrBusy", err)
			}
			if _, err := c.Events(ctx, 0); !errors.Is(err, ErrNoEvents) {
				t.Errorf("Events of a server without it = %v, want ErrNoEvents", err)
			}

			// A call given up on does not hold up others; its late reply is
			// dropped.
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			var late EchoReply
			if err := c.call(short, "Block", &EchoArgs{S: "late"}, &late); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Block = %v, want the deadline", err)
			}
			if err := c.call(ctx, "Echo", &EchoArgs{S: "meanwhile"}, &r); err != nil || r.S != "meanwhile" {
				t.Errorf("Echo while Block runs = %q, %v", r.S, err)
			}
			close(e.release)
			if err := c.call(ctx, "Echo", &EchoArgs{S: "after"}, &r); err != nil || r.S != "after" {
				t.Errorf("Echo after Block's reply = %q, %v", r.S, err)
			}
			if late.S != "" {
				t.Errorf("the abandoned call's reply was written: %q", late.S)
			}

			// Closed, or its peer gone: ErrUnavailable.
			c.Close()
			if err := c.call(ctx, "Echo", &EchoArgs{S: "closed"}, &r); !errors.Is(err, ErrUnavailable) {
				t.Errorf("Echo after Close = %v, want ErrUnavailable", err)
			}
		})
	}
}

// TestClientPeerGone: calls waiting when the connection breaks fail with
// ErrUnavailable.
func TestClientPeerGone(t *testing.T) {
	a, b := net.Pipe()
	e := &echo{release: make(chan struct{})}
	go ServeConn(a, e.methods())
	c := &Client{rpc: newRPCClient(b)}
	errc := make(chan error, 1)
	go func() { errc <- c.call(t.Context(), "Block", &EchoArgs{}, &EchoReply{}) }()
	time.Sleep(20 * time.Millisecond)
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("Block when the connection broke = %v, want ErrUnavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting call did not end when the connection broke")
	}
	close(e.release)
}
