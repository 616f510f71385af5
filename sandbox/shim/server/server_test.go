package server

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		ws        unix.WaitStatus
		code, sig int
	}{
		{0, 0, 0},
		{3 << 8, 3, 0},               // exited 3
		{unix.WaitStatus(9), 137, 9}, // killed by SIGKILL
		{unix.WaitStatus(15), 143, 15},
	} {
		if code, sig := (exit{status: tc.ws}).code(); code != tc.code || sig != tc.sig {
			t.Errorf("status %#x: got %d/%d, want %d/%d", tc.ws, code, sig, tc.code, tc.sig)
		}
	}
}

func TestDescendants(t *testing.T) {
	if pp, ok := parentOf(os.Getpid()); !ok || pp != os.Getppid() {
		t.Fatalf("parentOf(self) = %d %v", pp, ok)
	}
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var kids []procLink
	for range 200 {
		if kids = descendants(os.Getpid()); len(kids) >= 2 {
			break
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 5e6}, nil)
	}
	if len(kids) != 2 || kids[0].pid != cmd.Process.Pid || kids[1].ppid != cmd.Process.Pid {
		t.Fatalf("descendants: %+v (sh is %d)", kids, cmd.Process.Pid)
	}
	unix.Kill(kids[1].pid, unix.SIGKILL)
}
