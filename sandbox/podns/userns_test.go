package podns

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// owner returns the inode of the user namespace that owns the namespace
// pinned at p (ioctl NS_GET_USERNS).
func owner(t *testing.T, p string) uint64 {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const nsGetUserns = 0xb701
	ufd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nsGetUserns, 0)
	if errno != 0 {
		t.Fatalf("NS_GET_USERNS %s: %v", p, errno)
	}
	defer unix.Close(int(ufd))
	var st unix.Stat_t
	if err := unix.Fstat(int(ufd), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestCreateWithUserNS(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "ns")
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 200000, Size: 65536}}
	pins, err := Create(Options{Dir: dir, Kinds: []Kind{User, Net, IPC, UTS}, Hostname: "userpod",
		Sysctls: map[string]string{portKey: "80"}, UIDMappings: m, GIDMappings: m})
	if err != nil {
		t.Fatal(err)
	}
	allThreadsHome(t)
	var st unix.Stat_t
	if err := unix.Stat(pins[User], &st); err != nil {
		t.Fatal(err)
	}
	for _, k := range []Kind{Net, IPC, UTS} {
		if got := owner(t, pins[k]); got != st.Ino {
			t.Errorf("%s namespace owned by user namespace %d, want the pod's %d", k, got, st.Ino)
		}
	}
	out := nsRun(t, pins, "cat /proc/self/uid_map /proc/self/gid_map; hostname; cat "+portSys+"; cat /sys/class/net/lo/operstate /sys/class/net/lo/flags")
	f := strings.Fields(out)
	if len(f) < 9 || strings.Join(f[:6], " ") != "0 200000 65536 0 200000 65536" || f[6] != "userpod" || f[7] != "80" {
		t.Errorf("inside the pod namespaces: %q", out)
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir)
}

func TestCreateUserNSNeedsMappings(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "ns")
	if _, err := Create(Options{Dir: dir, Kinds: []Kind{User, Net}}); err == nil {
		t.Fatal("a user namespace without mappings was created")
	}
	assertGone(t, dir)
}
