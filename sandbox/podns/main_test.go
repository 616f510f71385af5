package podns

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// mainThreadHop is what throwaway did when called on the main thread.
var mainThreadHop = errNotRun

var errNotRun = errors.New("not run")

// TestMain starts on the main thread, the one place to check that throwaway
// never changes the namespaces of a thread that cannot end.
func TestMain(m *testing.M) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() && os.Geteuid() == 0 {
		mainThreadHop = hopFromMain()
	}
	runtime.UnlockOSThread()
	os.Exit(m.Run())
}

func hopFromMain() error {
	home, _ := os.Readlink("/proc/thread-self/ns/uts")
	done := make(chan error, 1)
	runtime.LockOSThread() // throwaway unlocks once; keep TestMain's lock
	throwaway(func() {
		if unix.Gettid() == unix.Getpid() {
			done <- fmt.Errorf("f ran on the main thread")
			return
		}
		done <- unix.Unshare(unix.CLONE_NEWUTS)
	})
	if err := <-done; err != nil {
		return err
	}
	if now, _ := os.Readlink("/proc/thread-self/ns/uts"); now != home {
		return fmt.Errorf("main thread moved from %s to %s", home, now)
	}
	return nil
}

func TestThrowawayFromMainThread(t *testing.T) {
	needRoot(t)
	if mainThreadHop == errNotRun {
		t.Skip("TestMain did not start on the main thread")
	}
	if mainThreadHop != nil {
		t.Fatal(mainThreadHop)
	}
}
