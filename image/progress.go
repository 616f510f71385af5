package image

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/berth-runtime/berth/image/registry"
)

// progressWatch cancels a pull whose transfers have moved no byte for the
// configured time. A slow pull that keeps moving is never cancelled. It
// also counts the bytes, and logs them every progressLogEvery for a long pull.
type progressWatch struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds of the last byte or response
	bytes   atomic.Int64 // received so far
	waiting atomic.Int32 // > 0 while this pull waits for a download slot
	active  atomic.Int32 // this pull's own downloads running: while any runs, a wait is no excuse for a stall
	stop    chan struct{}
}

// progressLogEvery is how often a pull still running says how far it got.
const progressLogEvery = 10 * time.Second

func watchProgress(ctx context.Context, cancel context.CancelCauseFunc, timeout time.Duration, what string, log *slog.Logger) *progressWatch {
	w := &progressWatch{timeout: timeout, stop: make(chan struct{})}
	w.touch()
	start := time.Now()
	go func() {
		tick := time.NewTicker(min(max(timeout/8, 10*time.Millisecond), time.Second))
		defer tick.Stop()
		logged := start
		for {
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if now.Sub(logged) >= progressLogEvery {
					logged = now
					log.Info("pull in progress", "ref", what, "bytes", w.bytes.Load(), "elapsed", now.Sub(start).Round(time.Second),
						"waiting_for_download_slot", w.waiting.Load() > 0)
				}
				if w.waiting.Load() > 0 && w.active.Load() == 0 {
					// The downloads holding the slots run their own watches;
					// one of ours may be what we wait on, and it is watched here.
					w.touch()
					continue
				}
				if time.Since(time.Unix(0, w.last.Load())) > timeout {
					cancel(fmt.Errorf("%w: pull of %s made no progress for %s", ErrNoProgress, what, timeout))
					return
				}
			}
		}
	}()
	return w
}

func (w *progressWatch) touch() { w.last.Store(time.Now().UnixNano()) }

// Close stops the watch.
func (w *progressWatch) Close() { close(w.stop) }

// transport counts every response and body byte as progress.
func (w *progressWatch) transport(base http.RoundTripper) http.RoundTripper {
	return registry.RoundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(req)
		w.touch()
		if resp != nil {
			resp.Body = &countingBody{ReadCloser: resp.Body, w: w}
		}
		return resp, err
	})
}

type countingBody struct {
	io.ReadCloser
	w *progressWatch
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.w.touch()
		b.w.bytes.Add(int64(n))
	}
	return n, err
}
