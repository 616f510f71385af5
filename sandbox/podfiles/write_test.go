package podfiles

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/atomicfile"
	"github.com/berth-runtime/berth/cri/errkind"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

type mountEntry struct{ point, fstype, opts, super string }

// mountsUnder parses /proc/self/mountinfo for mounts at or below dir.
func mountsUnder(t *testing.T, dir string) []mountEntry {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := 6
		for fields[sep] != "-" {
			sep++
		}
		e := mountEntry{fields[4], fields[sep+1], fields[5], fields[sep+3]}
		if e.point == dir || strings.HasPrefix(e.point, dir+"/") {
			out = append(out, e)
		}
	}
	return out
}

func hasOpts(list string, want ...string) bool {
	have := strings.Split(list, ",")
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func assertClean(t *testing.T, dir string) {
	t.Helper()
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		names := []string{}
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("files left in %s: %v", dir, names)
	}
}

func TestWritePod(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		size int64
		want string
	}{{0, "size=65536k"}, {1 << 20, "size=1024k"}} {
		dir := t.TempDir()
		dns := &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"ns.svc.cluster.local"}, Options: []string{"ndots:5"}}
		f, err := Write(Options{Dir: dir, Hostname: "pod-a", PodIPs: []string{"10.88.0.7"}, DNS: dns, ShmSize: tc.size})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Remove(dir) })
		if f.Hosts != filepath.Join(dir, "hosts") || f.Shm != filepath.Join(dir, "shm") {
			t.Fatalf("files = %+v", f)
		}
		if got := readFile(t, f.Hosts); !strings.HasSuffix(got, "\n10.88.0.7\tpod-a\n") {
			t.Errorf("hosts = %q", got)
		}
		if got := readFile(t, f.Resolv); got != "search ns.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n" {
			t.Errorf("resolv.conf = %q", got)
		}
		if got := readFile(t, f.Hostname); got != "pod-a\n" {
			t.Errorf("hostname = %q", got)
		}
		for _, p := range []string{f.Hosts, f.Resolv, f.Hostname} {
			if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
				t.Errorf("%s mode %v", p, st.Mode())
			}
		}
		m := mountsUnder(t, dir)
		if len(m) != 1 || m[0].point != f.Shm || m[0].fstype != "tmpfs" {
			t.Fatalf("mounts = %+v", m)
		}
		if !hasOpts(m[0].opts, "nosuid", "nodev", "noexec") || !hasOpts(m[0].super, tc.want) {
			t.Errorf("shm mount options %q / %q, want nosuid,nodev,noexec and %s", m[0].opts, m[0].super, tc.want)
		}
		// tmpfs leaves its default mode=1777 out of mountinfo: stat it.
		if st, err := os.Stat(f.Shm); err != nil || st.Mode()&(os.ModePerm|os.ModeSticky) != 0o777|os.ModeSticky {
			t.Errorf("shm mode %v, %v; want 1777", st.Mode(), err)
		}

		// Writing again (once the pod has its IPs) keeps the one shm mount.
		if _, err := Write(Options{Dir: dir, Hostname: "pod-a", PodIPs: []string{"10.88.0.8"}, DNS: dns, ShmSize: tc.size}); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, f.Hosts); !strings.HasSuffix(got, "\n10.88.0.8\tpod-a\n") {
			t.Errorf("rewritten hosts = %q", got)
		}
		if m := mountsUnder(t, dir); len(m) != 1 {
			t.Errorf("mounts after rewrite = %+v", m)
		}

		for range 2 {
			if err := Remove(dir); err != nil {
				t.Fatal(err)
			}
			assertClean(t, dir)
		}
	}
}

// The files of a pod with a user namespace of its own belong to its root's
// host IDs, also once rewritten.
func TestWriteOwner(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	opts := Options{Dir: dir, Hostname: "pod-u", HostIPC: true, RootUID: 1000000, RootGID: 1000001}
	for range 2 {
		f, err := Write(opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{f.Hosts, f.Resolv, f.Hostname} {
			var st syscall.Stat_t
			if err := syscall.Stat(p, &st); err != nil || st.Uid != 1000000 || st.Gid != 1000001 || st.Mode&0o777 != 0o644 {
				t.Errorf("%s: owner %d:%d mode %o, %v; want 1000000:1000001 0644", p, st.Uid, st.Gid, st.Mode&0o777, err)
			}
		}
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	assertClean(t, dir)
}

func TestWriteHost(t *testing.T) {
	dir := t.TempDir()
	// HostNetwork and HostIPC: copies of the host's files, no shm (so no
	// privileges needed). A nil DNS copies the host's resolv.conf too.
	f, err := Write(Options{Dir: dir, Hostname: "ignored", HostNetwork: true, HostIPC: true})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if readFile(t, f.Hosts) != readFile(t, hostHostsPath) || readFile(t, f.Resolv) != readFile(t, hostResolvPath) {
		t.Error("hosts or resolv.conf is not a copy of the host's")
	}
	if got := readFile(t, f.Hostname); got != host+"\n" {
		t.Errorf("hostname = %q, want the host's %q", got, host)
	}
	if f.Shm != "" {
		t.Errorf("HostIPC pod got shm %q", f.Shm)
	}
	// A ClusterFirstWithHostNet pod: host network, cluster DNS.
	f, err = Write(Options{Dir: dir, HostNetwork: true, HostIPC: true, DNS: &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, f.Resolv); got != "nameserver 10.96.0.10\n" {
		t.Errorf("resolv.conf = %q", got)
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	assertClean(t, dir)
}

func TestWriteFailureCleansUp(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	// A file where the shm folder goes: the files are written, then the
	// mount fails, and Write must take the files back.
	if err := os.WriteFile(filepath.Join(dir, "shm"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The node's failure, not the caller's: not an invalid argument.
	if _, err := Write(Options{Dir: dir, Hostname: "pod-a"}); err == nil || errors.Is(err, errkind.Invalid) {
		t.Fatalf("Write with a file in the way of shm: %v, want an error of no kind", err)
	}
	os.Remove(filepath.Join(dir, "shm"))
	assertClean(t, dir)

	// Bad input fails before anything is made; what the CRI caller sent
	// is an invalid argument, a bad pod IP (berth's own network's) is not.
	for name, c := range map[string]struct {
		o       Options
		invalid bool
	}{
		"bad DNS":  {Options{Hostname: "pod-a", DNS: &runtimeapi.DNSConfig{Servers: []string{"not-an-ip"}}}, true},
		"bad IP":   {Options{Hostname: "pod-a", PodIPs: []string{"x"}}, false},
		"no name":  {Options{}, true},
		"neg size": {Options{Hostname: "pod-a", ShmSize: -1}, true},
	} {
		c.o.Dir = dir
		if _, err := Write(c.o); err == nil || errors.Is(err, errkind.Invalid) != c.invalid {
			t.Errorf("%s: Write = %v, want an error, invalid argument %v", name, err, c.invalid)
		}
		assertClean(t, dir)
	}
	if _, err := Write(Options{Dir: dir, Hostname: "pod-a", DNS: &runtimeapi.DNSConfig{Servers: []string{"not-an-ip"}}}); err == nil || !strings.Contains(err.Error(), "not-an-ip") {
		t.Errorf("error does not name the server: %v", err)
	}
}

// TestRemoveSweepsTempFiles: a temp file of a write a crash cut short is
// removed with the pod's files.
func TestRemoveSweepsTempFiles(t *testing.T) {
	dir := t.TempDir()
	if err := writeAtomic(filepath.Join(dir, "hosts"), []byte("x"), os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	// A temp file a crash left behind is swept by Remove.
	os.WriteFile(filepath.Join(dir, ".hosts"+atomicfile.TempMark+"123"), nil, 0o600)
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left after Remove: %v", entries)
	}
}
