package detach

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helper starts sh -c script as a helper logging to a file in a temp folder.
func helper(t *testing.T, ctx context.Context, script string) (Child, error) {
	t.Helper()
	return Start(ctx, Command{
		Argv:     []string{"/bin/sh", "-c", script},
		Env:      []string{"PATH=/usr/bin:/bin"},
		ReadyEnv: "_TEST_READY_FD",
		Log:      filepath.Join(t.TempDir(), "helper.log"),
	})
}

// gone waits until pid is reaped (no /proc entry, not even a zombie's).
func gone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			t.Fatalf("helper %d not reaped: %s", pid, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A helper that says it serves is running in its own session, with the
// ready pipe at the fd its environment names; killed, it is reaped.
func TestStartWaitsForReady(t *testing.T) {
	c, err := helper(t, context.Background(), `[ "$_TEST_READY_FD" = 3 ] && echo ok >&3 && exec sleep 1000`)
	if err != nil {
		t.Fatal(err)
	}
	if sid, err := unix.Getsid(c.pid); err != nil || sid != c.pid {
		t.Fatalf("helper %d in session %d (%v), want its own", c.pid, sid, err)
	}
	c.Kill()
	gone(t, c.pid)
}

// One that exits first fails the start, and the error carries its log's end.
func TestStartExitedBeforeServing(t *testing.T) {
	_, err := helper(t, context.Background(), `echo "no config here" >&2; exit 1`)
	if err == nil || !strings.Contains(err.Error(), "exited before serving") || !strings.Contains(err.Error(), "helper.log: no config here") {
		t.Fatalf("start of a helper that exits: %v", err)
	}
}

// One not ready by ctx's end is killed, not left to come up later.
func TestStartNotReadyKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	mark := strconv.Itoa(900000 + os.Getpid()) // names this test's sleep
	if _, err := helper(t, ctx, "exec sleep "+mark); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("start of a helper that never gets ready: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for sleeping(mark) {
		if time.Now().After(deadline) {
			t.Fatal("the helper that was not ready still runs")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sleeping says whether a process runs sleep with the argument mark.
func sleeping(mark string) bool {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if string(b) == "sleep\x00"+mark+"\x00" {
			return true
		}
	}
	return false
}
