package image

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/berth-runtime/berth/image/registry"
)

// progressWatch cancels a pull whose transfers have moved no byte for the
// configured time. A slow pull that keeps moving is never cancelled.
type progressWatch struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds of the last byte or response
	waiting atomic.Int32 // > 0 while this pull waits on another pull's layer
	stop    chan struct{}
}

func watchProgress(ctx context.Context, cancel context.CancelCauseFunc, timeout time.Duration, what string) *progressWatch {
	w := &progressWatch{timeout: timeout, stop: make(chan struct{})}
	w.touch()
	go func() {
		tick := time.NewTicker(max(timeout/8, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if w.waiting.Load() > 0 {
					w.touch() // the pull we wait on runs its own watch
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
	}
	return n, err
}
