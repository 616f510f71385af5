//go:build crashpoints

package crashpoint

import (
	"os"
	"syscall"
)

var (
	target = os.Getenv("BERTH_CRASHPOINT")
	log    *os.File
)

func init() {
	if p := os.Getenv("BERTH_CRASHPOINT_LOG"); p != "" {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			panic("crashpoint: " + err.Error())
		}
		log = f
	}
}

// Hit logs the point and, if it is the target, kills berthd the way a power
// cut or the OOM killer would: no deferred function, no cleanup runs.
func Hit(op, step string) {
	name := op + ": " + step
	if log != nil {
		// One write per line: O_APPEND keeps concurrent points whole.
		log.WriteString(name + "\n")
	}
	if name == target {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
