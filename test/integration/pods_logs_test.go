package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerLogFormat checks the CRI log file of a container: every line
// a record "<RFC3339Nano> <stream> <P|F> <text>", stdout and stderr kept
// apart, lines longer than 16 KiB split into P records ended by an F one, a
// line of exactly 16 KiB and an empty line one F record each, and an
// unterminated last line written as P (as containerd and CRI-O do).
func TestContainerLogFormat(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("logformat")
	pod := e.runPod(t, cfg)

	const maxRecord = 16 << 10
	line := func(n int) string {
		return "/bin/busybox head -c " + strconv.Itoa(n) + " /dev/zero | /bin/busybox tr '\\0' a; echo"
	}
	script := strings.Join([]string{
		"echo out1", "echo err1 >&2", line(40000), "echo", line(maxRecord), "echo err2 >&2",
		"printf 'no newline at the end'",
	}, "; ")
	begin := time.Now()
	st, _ := e.runToExit(t, pod, cfg, e.ctrConfig("format", "/bin/sh", "-c", script))
	if st.ExitCode != 0 {
		t.Fatalf("exit code %d", st.ExitCode)
	}
	recs := readLog(t, st.LogPath)

	type rec struct {
		tag string
		n   int    // length of the text
		txt string // the text
	}
	a := func(tag string, n int) rec { return rec{tag, n, strings.Repeat("a", n)} }
	want := map[string][]rec{
		"stdout": {
			{"F", 4, "out1"},
			a("P", maxRecord), a("P", maxRecord), a("F", 40000-2*maxRecord),
			{"F", 0, ""},
			a("F", maxRecord),
			{"P", 21, "no newline at the end"},
		},
		"stderr": {{"F", 4, "err1"}, {"F", 4, "err2"}},
	}
	for stream, w := range want {
		var got []rec
		var last time.Time
		for _, r := range recs {
			if r.stream != stream {
				continue
			}
			got = append(got, rec{r.tag, len(r.text), r.text})
			if r.time.Before(last) || r.time.Before(begin.Add(-time.Second)) || r.time.After(time.Now()) {
				t.Errorf("%s record time %s out of order or range (previous %s, test began %s)", stream, r.time, last, begin)
			}
			last = r.time
		}
		if len(got) != len(w) {
			var tags []string
			for _, r := range got {
				tags = append(tags, r.tag+strconv.Itoa(r.n))
			}
			t.Errorf("%s: %d records (tag and length: %v), want %d", stream, len(got), tags, len(w))
			continue
		}
		for i := range w {
			if got[i] != w[i] {
				t.Errorf("%s record %d: %s of %d bytes, want %s of %d (%.20q…)", stream, i, got[i].tag, got[i].n, w[i].tag, w[i].n, got[i].txt)
			}
		}
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestContainerLogRotation checks ReopenContainerLog as the kubelet's log
// rotation uses it: the file is renamed, lines keep going to the renamed
// file until the reopen, then to a new file at log_path, and none is lost
// or written twice. A stopped container's log cannot be reopened.
func TestContainerLogRotation(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("logrotate")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("ticker", "/bin/sh", "-c", "i=0; while :; do echo line-$i; i=$((i+1)); sleep 0.05; done"))
	path := e.status(t, ctr).LogPath
	lines := func(p string) []int {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		var ns []int
		for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if _, text, ok := strings.Cut(l, " stdout F line-"); ok {
				n, err := strconv.Atoi(text)
				if err != nil {
					t.Fatalf("bad log line %q", l)
				}
				ns = append(ns, n)
			}
		}
		return ns
	}
	if !eventually(10*time.Second, func() bool { return len(lines(path)) >= 3 }) {
		t.Fatalf("no lines in %s", path)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	// Until the reopen the shim writes to the renamed file.
	n := len(lines(path + ".1"))
	if !eventually(10*time.Second, func() bool { return len(lines(path+".1")) >= n+3 }) {
		t.Errorf("the renamed file stopped growing before the reopen")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s exists before the reopen: %v", path, err)
	}
	if _, err := e.d.Runtime.ReopenContainerLog(t.Context(), &runtimeapi.ReopenContainerLogRequest{ContainerId: ctr}); err != nil {
		t.Fatalf("ReopenContainerLog: %v", err)
	}
	if !eventually(10*time.Second, func() bool { return len(lines(path)) >= 3 }) {
		t.Fatalf("no lines in the reopened %s", path)
	}
	e.stop(t, ctr, 0)
	old, cur := lines(path+".1"), lines(path)
	all := append(old, cur...)
	for i, n := range all {
		if n != i {
			t.Fatalf("line numbers across the rotation are not 0, 1, 2…: %v | %v", old, cur)
		}
	}

	// Stopped: nothing to reopen.
	_, err := e.d.Runtime.ReopenContainerLog(t.Context(), &runtimeapi.ReopenContainerLogRequest{ContainerId: ctr})
	assertCode(t, err, one(codes.FailedPrecondition), "not running")
	_, err = e.d.Runtime.ReopenContainerLog(t.Context(), &runtimeapi.ReopenContainerLogRequest{ContainerId: "0123456789abcdef"})
	assertCode(t, err, one(codes.NotFound), "0123456789abcdef")
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestLogPathConfinement: the log folder must be absolute and the log path
// a file inside it (the kubelet's NAME/RESTART.log is), or the call is refused
// with the field named and nothing left; and the shim never follows a
// symlink planted as the log file.
func TestLogPathConfinement(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	for _, dir := range []string{"relative/logs", "/tmp/../etc"} {
		cfg := e.podConfig("logdir")
		cfg.LogDirectory = dir
		_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		assertCode(t, err, one(codes.InvalidArgument), "log_directory")
	}
	cfg := e.podConfig("logpath")
	pod := e.runPod(t, cfg)
	for _, p := range []string{"../escape.log", "/abs.log", "a/../../escape.log", "a/.."} {
		cc := e.ctrConfig("bad", sleeper...)
		cc.LogPath = p
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		assertCode(t, err, one(codes.InvalidArgument), "log_path")
	}

	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.logs, "linked"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(e.logs, "linked", "0.log")); err != nil {
		t.Fatal(err)
	}
	cc := e.ctrConfig("linked", "/bin/echo", "written")
	cc.LogPath = "linked/0.log"
	if _, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc}); err == nil {
		t.Error("CreateContainer wrote its log through a symlink")
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Errorf("the symlink's target now holds %q", b)
	}
	good := e.ctrConfig("good", "/bin/echo", "fine")
	good.LogPath = "good/0.log"
	e.runToExit(t, pod, cfg, good)

	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
