package cgroups

import (
	"fmt"
	"io"
	"os"
	"testing"
)

// The privileged tests re-exec the test binary as the process they put into
// a cgroup; helperEnv picks what it does there.
const helperEnv = "BERTH_CGROUPS_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "hold":
		helperHold()
	case "alloc":
		helperAlloc()
	default:
		os.Exit(m.Run())
	}
}

// helperHold waits until it is in its cgroup (one byte on stdin), charges
// 8 MiB there, says "ready" and stays until stdin closes.
func helperHold() {
	waitGo()
	buf := touch(8 << 20)
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = buf[len(buf)-1]
	os.Exit(0)
}

// helperAlloc waits until it is in its cgroup, then allocates far beyond
// the test's limit; the kernel should OOM-kill it before it exits.
func helperAlloc() {
	waitGo()
	var keep [][]byte
	for range 256 {
		keep = append(keep, touch(1<<20))
	}
	fmt.Println("survived", len(keep))
	os.Exit(0)
}

func waitGo() {
	var b [1]byte
	if _, err := os.Stdin.Read(b[:]); err != nil {
		os.Exit(2)
	}
}

// touch allocates n bytes and writes every page so they are charged.
func touch(n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	return b
}
