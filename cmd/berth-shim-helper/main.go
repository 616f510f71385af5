// Command berth-shim-helper does the libcontainer work of berth's per-pod
// shim (cmd/berth-shim), one operation per process, so that the shim,
// which stays for the pod's lifetime, never holds what libcontainer leaves
// resident. It is installed beside berth-shim. Modes:
//
//	berth-shim-helper helper                      an op process: one operation for a shim (package sandbox/shim/ops)
//	berth-shim-helper helper --serve POD_DIR      the exec server: execs for a shim, until it hangs up
//	berth-shim-helper init     libcontainer's container init (re-exec)
package main

import (
	"fmt"
	"os"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
	// Without it the cgroup manager cannot apply device rules.
	_ "github.com/opencontainers/cgroups/devices"
	// nsexec: the C constructor that joins namespaces before the Go runtime
	// starts, in "init" mode.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/shim/ops"
)

func init() {
	// As runc's own "init" command: before main, after nsexec.
	if len(os.Args) > 1 && os.Args[1] == "init" {
		// The container's processes get the node's huge page policy, not
		// the shim's (PR_SET_THP_DISABLE, inherited by berth-shim-helper and by
		// every process it starts).
		_ = unix.Prctl(unix.PR_SET_THP_DISABLE, 0, 0, 0, 0)
		libcontainer.Init()
	}
}

func main() {
	switch {
	case len(os.Args) == 2 && os.Args[1] == shim.OpsArg:
		os.Exit(ops.Run())
	case len(os.Args) == 4 && os.Args[1] == shim.OpsArg && os.Args[2] == shim.ExecServerArg:
		os.Exit(ops.ServeExecs())
	}
	fmt.Fprintln(os.Stderr, "usage: berth-shim-helper helper [--serve POD_DIR] | init (started by berth-shim)")
	os.Exit(2)
}
