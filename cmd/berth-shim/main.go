// Command berth-shim is berth's per-pod monitor (see docs/architecture.md, "Process
// model"):
//
//	berth-shim serve --dir POD_DIR   serve a pod (package sandbox/shim/server)
//
// It stays for the pod's lifetime, so it stays small on purpose: no
// libcontainer (its work is berth-shim-helper's, cmd/berth-shim-helper,
// installed beside it), no gRPC, no CRI API, no registry client. The pause
// of shared-PID pods is another program, cmd/berth-pause.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cri/detach"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/shim/server"
)

func init() {
	// No transparent huge pages in the shim, as early as Go code runs: on
	// kernels that default to them (Debian's), khugepaged folds the idle
	// shim's thread stacks and runtime metadata into 2 MiB pages, up to a
	// few MiB more per pod (GODEBUG's disablethp, set by shim.Start, covers
	// the heap only).
	_ = unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	if os.Args[1] != "serve" {
		usage()
	}
	os.Exit(serve(os.Args[2:]))
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: berth-shim serve --dir POD_DIR")
	os.Exit(2)
}

func serve(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	dir := fs.String("dir", "", "pod state folder")
	fs.Parse(args)
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "berth-shim serve: --dir is required")
		return 2
	}
	tuneMemory()
	if err := server.Run(*dir, detach.ReadyPipe(shim.ReadyFdEnv)); err != nil {
		fmt.Fprintf(os.Stderr, "berth-shim: %v\n", err)
		return 1
	}
	return 0
}

// tuneMemory keeps the idle shim small (one per pod): collect early and
// return freed memory promptly (one P is set by shim.Start, in the
// environment). GOGC / GOMEMLIMIT in the environment win.
func tuneMemory() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(16 << 20)
	}

}
