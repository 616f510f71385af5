package stats

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestCountFDs counts this test's own descriptors, before and after it
// opens a file and a socket (a real process: its /proc/<pid>/fd).
func TestCountFDs(t *testing.T) {
	pid := os.Getpid()
	fds, sockets := countFDs([]int{pid})
	if fds == 0 {
		t.Fatal("no descriptors counted for this process")
	}
	f, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fds2, sockets2 := countFDs([]int{pid})
	if fds2 != fds+2 || sockets2 != sockets+1 {
		t.Errorf("after opening a file and a socket: %d descriptors, %d sockets; want %d and %d", fds2, sockets2, fds+2, sockets+1)
	}
	// A process gone counts nothing; the others still count.
	if n, s := countFDs([]int{pid, 1 << 30}); n != fds2 || s != sockets2 {
		t.Errorf("with a pid that is not there: %d, %d; want %d, %d", n, s, fds2, sockets2)
	}
}

// TestMountSource: the source of the mount on top at a mount point, with
// mountinfo's escapes undone.
func TestMountSource(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	err := os.WriteFile(mi, []byte(
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"+
			"30 22 8:2 / /var/lib/berth rw shared:2 - xfs /dev/sdb rw\n"+
			"31 30 0:40 / /var/lib/berth rw - tmpfs tmp\\040fs rw\n"+
			"32 22 8:3 / /mnt/with\\040space rw - ext4 /dev/sdc rw\n"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for mp, want := range map[string]string{"/": "/dev/sda1", "/var/lib/berth": "tmp fs", "/mnt/with space": "/dev/sdc"} {
		if got, err := mountSource(mi, mp); err != nil || got != want {
			t.Errorf("mountSource(%q) = %q, %v; want %q", mp, got, err, want)
		}
	}
	if _, err := mountSource(mi, "/nowhere"); err == nil {
		t.Error("a mount point that is not there has a source")
	}
}
