package shim

import (
	"bufio"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// The shim's calls speak net/rpc's wire format (a gob stream each way: a
// request header and its argument, a response header and its reply), so
// that a berthd and the shims it outlives or that outlive it still
// understand each other. They do not use package net/rpc: it imports
// net/http, crypto/tls and html/template (and parses a template at init):
// 3.3 MB of the shim's binary (10.7 MB then), about 0.25 MB of each shim's
// anonymous memory and half a millisecond of CPU at every start of that
// binary, which is every container's and every exec's init too.

// request and response are net/rpc's headers (gob matches fields by name).
type request struct {
	ServiceMethod string
	Seq           uint64
}

type response struct {
	ServiceMethod string
	Seq           uint64
	Error         string
}

// serverError is an error the shim answered a call with, as text.
type serverError string

func (e serverError) Error() string { return string(e) }

// errClosed ends the calls of a client that was closed or whose
// connection broke.
var errClosed = errors.New("connection is shut down")

// unknownMethod is net/rpc's answer to a method the server lacks: what a
// shim from before a call answers.
const unknownMethod = "rpc: can't find method "

// codec is one connection's gob streams; writes are whole messages.
type codec struct {
	conn io.ReadWriteCloser
	dec  *gob.Decoder
	wmu  sync.Mutex
	w    *bufio.Writer
	enc  *gob.Encoder
}

// connBuffer is the size of a connection's read and write buffers, not
// bufio's 4 KB: berthd keeps a connection to every pod's shim (at 250 pods,
// 4 KB each way was 2 MB of its 14 MB live heap, twice that in RSS), and
// calls and replies are a few hundred bytes; a bigger message goes past
// the buffer.
const connBuffer = 512

func newCodec(conn io.ReadWriteCloser) *codec {
	w := bufio.NewWriterSize(conn, connBuffer)
	// A bufio.Reader is an io.ByteReader: gob adds no buffer of its own.
	return &codec{conn: conn, dec: gob.NewDecoder(bufio.NewReaderSize(conn, connBuffer)), w: w, enc: gob.NewEncoder(w)}
}

// skip reads one value and drops it.
func (c *codec) skip() error {
	var nothing any // a nil interface: gob reads the value and discards it
	return c.dec.Decode(nothing)
}

func (c *codec) write(header, body any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.enc.Encode(header); err != nil {
		return err
	}
	if err := c.enc.Encode(body); err != nil {
		return err
	}
	return c.w.Flush()
}

// rpcClient multiplexes calls over one connection.
type rpcClient struct {
	codec *codec

	mu      sync.Mutex
	seq     uint64
	pending map[uint64]*pendingCall
	err     error // once set, the connection is done
}

type pendingCall struct {
	reply any
	done  chan error // buffered
}

func newRPCClient(conn io.ReadWriteCloser) *rpcClient {
	c := &rpcClient{codec: newCodec(conn), pending: map[uint64]*pendingCall{}}
	go c.read()
	return c
}

// start sends a call; its outcome arrives on the returned call's done.
func (c *rpcClient) start(method string, args, reply any) (uint64, *pendingCall) {
	call := &pendingCall{reply: reply, done: make(chan error, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		call.done <- c.err
		return 0, call
	}
	c.seq++
	seq := c.seq
	c.pending[seq] = call
	c.mu.Unlock()
	if err := c.codec.write(&request{ServiceMethod: method, Seq: seq}, args); err != nil {
		if c.take(seq) != nil {
			call.done <- err
		}
	}
	return seq, call
}

// abandon forgets a call whose caller stopped waiting: its reply, if it
// comes, is read and dropped.
func (c *rpcClient) abandon(seq uint64) { c.take(seq) }

func (c *rpcClient) take(seq uint64) *pendingCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.pending[seq]
	delete(c.pending, seq)
	return call
}

// read delivers replies until the connection ends, then fails what is
// still pending.
func (c *rpcClient) read() {
	var err error
	for err == nil {
		var h response
		if err = c.codec.dec.Decode(&h); err != nil {
			break
		}
		call := c.take(h.Seq)
		switch {
		case call == nil:
			err = c.codec.skip()
		case h.Error != "":
			err = c.codec.skip()
			call.done <- serverError(h.Error)
		default:
			err = c.codec.dec.Decode(call.reply)
			if err != nil {
				err = fmt.Errorf("reading reply: %w", err)
			}
			call.done <- err
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	for seq, call := range c.pending {
		call.done <- c.err
		delete(c.pending, seq)
	}
	c.mu.Unlock()
}

func (c *rpcClient) close() error {
	c.mu.Lock()
	if c.err == nil {
		c.err = errClosed
	}
	c.mu.Unlock()
	return c.codec.conn.Close()
}

// Method is one call a shim serves: its argument is decoded into a new A,
// and f fills in the reply.
type Method struct {
	args func() any
	call func(args any) (reply any, err error)
}

// NewMethod makes f a Method.
func NewMethod[A, R any](f func(*A, *R) error) Method {
	return Method{
		args: func() any { return new(A) },
		call: func(args any) (any, error) {
			r := new(R)
			err := f(args.(*A), r)
			return r, err
		},
	}
}

// ServeConn answers the calls on conn, by method name (the part after
// ServiceName), each in a goroutine of its own as they arrive, until the
// connection ends.
func ServeConn(conn io.ReadWriteCloser, methods map[string]Method) {
	c := newCodec(conn)
	defer conn.Close()
	for {
		var h request
		if err := c.dec.Decode(&h); err != nil {
			return
		}
		name, ok := strings.CutPrefix(h.ServiceMethod, ServiceName+".")
		m, known := methods[name]
		if !ok || !known {
			if c.skip() != nil {
				return
			}
			go c.write(&response{ServiceMethod: h.ServiceMethod, Seq: h.Seq, Error: unknownMethod + h.ServiceMethod}, struct{}{})
			continue
		}
		args := m.args()
		if c.dec.Decode(args) != nil {
			return
		}
		go func() {
			reply, err := m.call(args)
			resp := &response{ServiceMethod: h.ServiceMethod, Seq: h.Seq}
			if err != nil {
				// net/rpc sends an empty body with an error.
				resp.Error, reply = err.Error(), struct{}{}
			}
			c.write(resp, reply)
		}()
	}
}
