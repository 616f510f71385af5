package main

import (
	"fmt"
	"io"

	"github.com/berth-runtime/berth/cmd/berthd/config"
)

// errInvalidConfig makes berthctl exit 1 after the problems were printed.
type errInvalidConfig struct{ n int }

func (e errInvalidConfig) Error() string {
	if e.n == 1 {
		return "1 problem"
	}
	return fmt.Sprintf("%d problems", e.n)
}

// configCheck prints every problem of a berthd config file, as
// FILE:LINE: message, with berthd's own decoder and checks.
func configCheck(w io.Writer, path string) error {
	probs, err := config.Check(path)
	if err != nil {
		return err
	}
	for _, p := range probs {
		if p.Line > 0 {
			fmt.Fprintf(w, "%s:%d: %s\n", path, p.Line, p.Msg)
		} else {
			fmt.Fprintf(w, "%s: %s\n", path, p.Msg)
		}
	}
	if len(probs) > 0 {
		return errInvalidConfig{len(probs)}
	}
	fmt.Fprintf(w, "%s: ok\n", path)
	return nil
}
