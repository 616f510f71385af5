package lazyd

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berth-runtime/berth/cri/detach"
)

// ReadyFdEnv names the fd on which the server writes "ok\n" once its
// socket listens; it is closed without that on failure.
const ReadyFdEnv = "_BERTH_LAZYD_READY_FD"

// ErrNotServing is Dial's error when no server answers in the folder.
var ErrNotServing = errors.New("no lazy layer server is running")

// CallTimeout is the usual bound of a call (Dial's callTimeout): the
// server answers each in milliseconds (Mount: a FUSE mount), so one that
// does not is wedged, and berthd's callers (ImageFsInfo, metrics,
// collection, pulls) go on without it.
const CallTimeout = time.Minute

// ErrNoAnswer is a call's error when the server did not answer in time:
// it may still be alive, and may still carry the call out.
var ErrNoAnswer = errors.New("did not answer")

// Client is berthd's connection to the server.
type Client struct {
	c       *rpc.Client
	sock    string
	timeout time.Duration
}

// Dial connects to the server serving in dir, ErrNotServing if none does;
// each call of the client fails with ErrNoAnswer after callTimeout.
func Dial(dir string, callTimeout time.Duration) (*Client, error) {
	conn, err := net.Dial("unix", filepath.Join(dir, SocketFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotServing, err)
	}
	return &Client{c: rpc.NewClient(conn), sock: filepath.Join(dir, SocketFile), timeout: callTimeout}, nil
}

// Start starts the server, binary (berthd's lazy-serve mode) with cfg,
// detached (cri/detach: its own session, so that berthd's stop or
// SIGKILL, or one of its process group, leaves it serving), and connects
// to it (Dial's callTimeout). It stays berthd's child, reaped when it
// exits, until berthd goes.
func Start(ctx context.Context, binary []string, cfg ServeConfig, callTimeout time.Duration) (*Client, error) {
	if err := rootOnlyDir(cfg.Dir); err != nil {
		return nil, err
	}
	_, err := detach.Start(ctx, detach.Command{
		Argv:     append(slices.Clone(binary), cfg.Args()...),
		Env:      serverEnv(os.Environ()),
		ReadyEnv: ReadyFdEnv,
		Log:      filepath.Join(cfg.Dir, LogFile),
	})
	if err != nil {
		return nil, fmt.Errorf("lazy layer server: %w", err)
	}
	return Dial(cfg.Dir, callTimeout)
}

// CrashPointEnv names the crash point (cri/crashpoint) the server, not
// berthd, dies at: berthd's own BERTH_CRASHPOINT is not passed on, since a
// test that kills berthd at one of its points wants the server alive.
// The crash point log is shared.
const CrashPointEnv = "BERTH_LAZYD_CRASHPOINT"

// serverEnv is berthd's environment for the server.
func serverEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, "BERTH_CRASHPOINT="):
		case strings.HasPrefix(kv, CrashPointEnv+"="):
			out = append(out, "BERTH_CRASHPOINT="+strings.TrimPrefix(kv, CrashPointEnv+"="))
		default:
			out = append(out, kv)
		}
	}
	return out
}

// Ready tells the process that started the server (Start) that it serves.
func Ready() { detach.Ready(detach.ReadyPipe(ReadyFdEnv)) }

func (c *Client) call(method string, args, reply any) error {
	return c.callWithin(c.timeout, method, args, reply)
}

// callWithin makes a call that fails if no answer comes within d. reply
// must be the caller's own: an answer after d may still write it.
func (c *Client) callWithin(d time.Duration, method string, args, reply any) error {
	call := c.c.Go(service+"."+method, args, reply, make(chan *rpc.Call, 1))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-call.Done:
		return call.Error
	case <-t.C:
		return fmt.Errorf("lazy layer server on %s: %s %w within %s", c.sock, method, ErrNoAnswer, d)
	}
}

// Mount serves a prepared layer.
func (c *Client) Mount(a MountArgs) error { return c.call("Mount", a, &Empty{}) }

// Complete starts the layer's background fetch and verification (once).
func (c *Client) Complete(key string) error { return c.call("Complete", key, &Empty{}) }

// demandLeaseTerm is how long a pull's demand (Demand) lasts unless renewed:
// what a berthd that dies mid-pull holds the background fetches for.
const demandLeaseTerm = 10 * time.Second

// Demand holds the server's background fetches as demand while a pull
// fetches a layer's prioritised files, until end is called. Meanwhile it
// renews the demand's lease a few times a lease, so that only a berthd
// that died (or a server that stopped answering) lets it run out. end
// says whether a renewal or the end failed.
func (c *Client) Demand() (end func() error, err error) { return c.demand(demandLeaseTerm) }

// demand is Demand with a lease of term.
func (c *Client) demand(term time.Duration) (end func() error, err error) {
	args := DemandArgs{ID: rand.Text(), For: term}
	// Bounded as a renewal: a hold is not worth a pull's wait on a
	// server slow to answer.
	if err := c.callWithin(term/3, "Demand", args, &Empty{}); err != nil {
		return nil, err
	}
	stop, renewed := make(chan struct{}), make(chan error, 1)
	go func() { renewed <- c.renewDemand(DemandArgs{ID: args.ID, For: term, Renew: true}, stop) }()
	return func() error {
		close(stop)
		return errors.Join(<-renewed, c.call("EndDemand", args.ID, &Empty{}))
	}, nil
}

// renewDemand renews the demand's lease until stop closes; a renewal that
// fails ends it, the lease running out then.
func (c *Client) renewDemand(args DemandArgs, stop <-chan struct{}) error {
	t := time.NewTicker(args.For / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-t.C:
			if err := c.callWithin(args.For/3, "Demand", args, &Empty{}); err != nil {
				return fmt.Errorf("renew a pull's demand: %w", err)
			}
		}
	}
}

// Unmount stops serving the layer; one still in use stays, and the error
// says so.
func (c *Client) Unmount(key string) error { return c.call("Unmount", key, &Empty{}) }

// Status is the server's status now.
func (c *Client) Status() (Status, error) {
	return c.WaitStatus(false, 0)
}

// WaitStatus is the server's status, with wait once its event count
// passed after, or after a while.
func (c *Client) WaitStatus(wait bool, after uint64) (Status, error) {
	st := new(Status) // not read after a timeout: a late answer writes it
	d := c.timeout
	if wait {
		d += waitBound // the long poll's own bound
	}
	if err := c.callWithin(d, "Status", StatusArgs{Wait: wait, After: after}, st); err != nil {
		return Status{}, err
	}
	return *st, nil
}

// FindChunk names a cached chunk of the digest in a served layer.
func (c *Client) FindChunk(d string) (string, bool, error) {
	r := new(ChunkReply) // not read after a timeout: a late answer writes it
	if err := c.call("FindChunk", d, r); err != nil {
		return "", false, err
	}
	return r.Path, r.Found, nil
}

// Exit stops the server if it serves no layer (else the error says how
// many it serves).
func (c *Client) Exit() error {
	err := c.call("Exit", Empty{}, &Empty{})
	if errors.Is(err, rpc.ErrShutdown) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil // it exited before its answer got out
	}
	return err
}

// Gone says whether err is a call's that found the server gone.
func Gone(err error) bool {
	return errors.Is(err, rpc.ErrShutdown) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrNotServing)
}

// Close closes the connection; the server serves on.
func (c *Client) Close() error { return c.c.Close() }
