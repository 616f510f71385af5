// Package readyfd is how berthd learns that a process it started detached
// (a pod's shim, the lazy layer server) serves: the child writes "ok\n"
// on a pipe once its socket listens, and the pipe closes without it when
// the child dies first.
package readyfd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// Wait waits for "ok\n" on r, the read end of the pipe whose write end
// only the child holds, until ctx is done.
func Wait(ctx context.Context, r *os.File) error {
	stop := context.AfterFunc(ctx, func() { r.SetReadDeadline(time.Now()) })
	defer stop()
	line, err := bufio.NewReader(r).ReadString('\n')
	if line == "ok\n" {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("not ready: %w", ctx.Err())
	}
	return errors.New("exited before serving")
}
