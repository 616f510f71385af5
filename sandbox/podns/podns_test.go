package podns

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cri/errkind"
)

const (
	portKey = "net.ipv4.ip_unprivileged_port_start"
	portSys = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
	shmKey  = "kernel.shm_rmid_forced"
	shmSys  = "/proc/sys/kernel/shm_rmid_forced"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// mountsUnder lists mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mp := unescapeMountinfo(strings.Fields(sc.Text())[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

func assertGone(t *testing.T, dir string) {
	t.Helper()
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left under %s: %v", dir, m)
	}
	for k := range cloneFlags {
		if _, err := os.Lstat(filepath.Join(dir, string(k))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin %s left behind (%v)", k, err)
		}
	}
}

// nsRun runs a shell command inside the pinned namespaces.
func nsRun(t *testing.T, pins map[Kind]string, script string) string {
	t.Helper()
	args := []string{}
	for k, p := range pins {
		args = append(args, fmt.Sprintf("--%s=%s", k, p))
	}
	args = append(args, "sh", "-c", script)
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter %v: %v: %s", args, err, out)
	}
	return string(out)
}

// allThreadsHome waits for every thread of the test process to be back in
// the host network namespace: Create's thread must be discarded.
func allThreadsHome(t *testing.T) {
	t.Helper()
	home, _ := os.Readlink("/proc/self/ns/net")
	deadline := time.Now().Add(3 * time.Second)
	for {
		var stray []string
		tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
		for _, p := range tasks {
			if l, err := os.Readlink(p); err == nil && l != home {
				stray = append(stray, p+" -> "+l)
			}
		}
		if len(stray) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads still in a pod namespace: %v", stray)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCreateAll(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "pod")
	hostName, _ := os.Hostname()
	hostPort, hostShm := readTrim(t, portSys), readTrim(t, shmSys)

	pins, err := Create(Options{
		Dir:      dir,
		Kinds:    []Kind{Net, IPC, UTS},
		Hostname: "pod-a",
		Sysctls:  map[string]string{portKey: "0", shmKey: "1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(dir) })
	if len(pins) != 3 || pins[Net] != filepath.Join(dir, "net") {
		t.Fatalf("pins = %v", pins)
	}

	out := nsRun(t, pins, "hostname; cat "+portSys+" "+shmSys+"; ip -o link show lo")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || lines[0] != "pod-a" || lines[1] != "0" || lines[2] != "1" {
		t.Fatalf("inside the pod: %q", out)
	}
	if !strings.Contains(lines[3], ",UP") {
		t.Errorf("lo not up: %s", lines[3])
	}

	if h, _ := os.Hostname(); h != hostName {
		t.Errorf("host hostname changed: %q → %q", hostName, h)
	}
	if v := readTrim(t, portSys); v != hostPort {
		t.Errorf("host %s changed: %s → %s", portKey, hostPort, v)
	}
	if v := readTrim(t, shmSys); v != hostShm {
		t.Errorf("host %s changed: %s → %s", shmKey, hostShm, v)
	}

	for k, p := range pins {
		var pinSt, hostSt unix.Stat_t
		if err := unix.Stat(p, &pinSt); err != nil {
			t.Fatal(err)
		}
		if err := unix.Stat("/proc/self/ns/"+string(k), &hostSt); err != nil {
			t.Fatal(err)
		}
		if pinSt.Ino == hostSt.Ino {
			t.Errorf("%s pin is the host's namespace (inode %d)", k, pinSt.Ino)
		}
		inside := nsRun(t, pins, "readlink /proc/self/ns/"+string(k))
		if want := fmt.Sprintf("%s:[%d]", k, pinSt.Ino); strings.TrimSpace(inside) != want {
			t.Errorf("%s: process joined %q, pin is %s", k, inside, want)
		}
	}
	if m := mountsUnder(t, dir); len(m) != 3 {
		t.Errorf("mounts under %s: %v", dir, m)
	}
	allThreadsHome(t)

	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir)
	if err := Remove(dir); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if err := Remove(filepath.Join(dir, "never")); err != nil {
		t.Fatalf("Remove of a missing dir: %v", err)
	}
}

func TestCreateSubset(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	// A host-network pod: IPC and UTS only, so the hostname is set but a
	// net.* sysctl is refused.
	pins, err := Create(Options{Dir: dir, Kinds: []Kind{IPC, UTS}, Hostname: "pod-b", Sysctls: map[string]string{"fs.mqueue.msg_max": "20"}})
	if err != nil {
		t.Fatal(err)
	}
	defer Remove(dir)
	if _, ok := pins[Net]; ok || len(pins) != 2 {
		t.Fatalf("pins = %v", pins)
	}
	if out := nsRun(t, pins, "hostname; cat /proc/sys/fs/mqueue/msg_max"); out != "pod-b\n20\n" {
		t.Fatalf("inside: %q", out)
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir)

	// No namespaces at all (host network and IPC): nothing to pin.
	if pins, err := Create(Options{Dir: dir}); err != nil || len(pins) != 0 {
		t.Fatalf("empty Kinds: %v, %v", pins, err)
	}
}

func TestCreateFailureCleansUp(t *testing.T) {
	needRoot(t)
	all := []Kind{Net, IPC, UTS}
	for name, tc := range map[string]struct {
		opts Options
		key  string
	}{
		// Fails on the thread, after the pins are mounted.
		"missing key": {Options{Kinds: all, Hostname: "x", Sysctls: map[string]string{shmKey: "1", "net.nonexistent.key": "1"}}, "net.nonexistent.key"},
		// Fails before anything is made.
		"host sysctl": {Options{Kinds: all, Sysctls: map[string]string{"vm.swappiness": "10"}}, "vm.swappiness"},
		"not created": {Options{Kinds: []Kind{Net}, Sysctls: map[string]string{shmKey: "1"}}, shmKey},
		"bad value":   {Options{Kinds: all, Sysctls: map[string]string{portKey: "nope"}}, portKey},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			tc.opts.Dir = dir
			before := readTrim(t, portSys)
			_, err := Create(tc.opts)
			if !errors.Is(err, errkind.Invalid) || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("err = %v, want an invalid argument naming %s", err, tc.key)
			}
			assertGone(t, dir)
			if v := readTrim(t, portSys); v != before {
				t.Errorf("host sysctl changed")
			}
		})
	}
	// The node failing (no folder for the pins) is not the caller's error.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(Options{Dir: filepath.Join(file, "ns"), Kinds: all}); err == nil || errors.Is(err, errkind.Invalid) {
		t.Errorf("Create below a regular file: %v, want an error of no kind", err)
	}
	allThreadsHome(t)
}

func TestCreateKeepsExistingFile(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	other := filepath.Join(dir, "ipc")
	if err := os.WriteFile(other, []byte("someone else's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(Options{Dir: dir, Kinds: []Kind{Net, IPC, UTS}}); err == nil {
		t.Fatal("Create over an existing pin succeeded")
	}
	if b, err := os.ReadFile(other); err != nil || string(b) != "someone else's" {
		t.Fatalf("existing file touched: %q, %v", b, err)
	}
	for _, k := range []string{"net", "uts"} {
		if _, err := os.Lstat(filepath.Join(dir, k)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind", k)
		}
	}
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
}

func TestConcurrentCreate(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	const n = 20
	pins := make([]map[Kind]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			pins[i], errs[i] = Create(Options{
				Dir:      filepath.Join(base, fmt.Sprint(i)),
				Kinds:    []Kind{Net, IPC, UTS},
				Hostname: fmt.Sprintf("pod-%d", i),
				Sysctls:  map[string]string{portKey: fmt.Sprint(100 + i)},
			})
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for i := range n {
			Remove(filepath.Join(base, fmt.Sprint(i)))
		}
	})
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("pod %d: %v", i, errs[i])
		}
		want := fmt.Sprintf("pod-%d\n%d\n", i, 100+i)
		if out := nsRun(t, pins[i], "hostname; cat "+portSys); out != want {
			t.Errorf("pod %d: %q, want %q", i, out, want)
		}
	}
	allThreadsHome(t)
	for i := range n {
		if err := Remove(filepath.Join(base, fmt.Sprint(i))); err != nil {
			t.Error(err)
		}
	}
	if m := mountsUnder(t, base); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
}

func TestDoInNetNS(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	pins, err := Create(Options{Dir: dir, Kinds: []Kind{Net}, Sysctls: map[string]string{portKey: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer Remove(dir)
	var st unix.Stat_t
	if err := unix.Stat(pins[Net], &st); err != nil {
		t.Fatal(err)
	}
	err = DoInNetNS(pins[Net], func() error {
		if l, _ := os.Readlink("/proc/thread-self/ns/net"); l != fmt.Sprintf("net:[%d]", st.Ino) {
			return fmt.Errorf("thread in %s", l)
		}
		if v, _ := os.ReadFile(portSys); strings.TrimSpace(string(v)) != "0" {
			return fmt.Errorf("sysctl inside = %q", v)
		}
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		if lo.Flags&net.FlagUp == 0 {
			return errors.New("lo down")
		}
		ifs, err := net.Interfaces()
		if err != nil || len(ifs) != 1 {
			return fmt.Errorf("interfaces in a fresh netns: %v, %v", ifs, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sentinel := errors.New("from f")
	if err := DoInNetNS(pins[Net], func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Fatalf("f's error lost: %v", err)
	}
	if err := DoInNetNS(filepath.Join(dir, "missing"), func() error { return nil }); err == nil {
		t.Fatal("missing pin accepted")
	}
	if err := DoInNetNS("/proc/self/ns/ipc", func() error { return nil }); err == nil {
		t.Fatal("an ipc namespace accepted as a netns")
	}
	allThreadsHome(t)
}

func TestPrepareRoot(t *testing.T) {
	needRoot(t)
	root := filepath.Join(t.TempDir(), "netns")
	for range 2 {
		if err := PrepareRoot(root); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	count := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if unescapeMountinfo(fields[4]) != root {
			continue
		}
		count++
		// Optional fields (shared:N, master:N) sit between field 6 and "-".
		for _, opt := range fields[6:] {
			if opt == "-" {
				break
			}
			if strings.HasPrefix(opt, "shared:") {
				t.Errorf("root is shared: %s", sc.Text())
			}
		}
	}
	if count != 1 {
		t.Fatalf("root mounted %d times, want 1", count)
	}
	dir := filepath.Join(root, "pod")
	if _, err := Create(Options{Dir: dir, Kinds: []Kind{Net, IPC, UTS}}); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir)
}
