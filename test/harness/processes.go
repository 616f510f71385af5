package harness

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// LiveProcessesWithArg returns the PIDs of processes with an argument
// containing substr. Zombies do not count: they hold nothing, and on some
// machines PID 1 never reaps the orphans it inherits.
// It takes no testing.TB: tests call it from goroutines that poll.
func LiveProcessesWithArg(substr string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*") // fails only on a bad pattern
	var pids []int
	for _, dir := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(substr)) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// The state follows the parenthesised command name.
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		pids = append(pids, pid)
	}
	return pids
}

// Eventually reports whether cond became true within d, asking every
// 10 ms: a test's wait for a condition, never a fixed sleep.
func Eventually(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
