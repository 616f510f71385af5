package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestContainerFilesUnreachableByHostUsers is the containerd CVE-2021-41103
// class: root in a container writes a setuid-root binary into its rootfs,
// and a host user runs it from the writable layer, whose path
// /proc/self/mountinfo shows to everyone. An unprivileged host user
// (nobody) must reach berth's root folder but nothing a container wrote;
// a tree left with wider modes is narrowed again when berthd starts.
func TestContainerFilesUnreachableByHostUsers(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	openToEveryone(t, filepath.Dir(e.d.Root)) // only berth's own modes stand in the way
	cfg := e.podConfig("hostaccess")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("writer", sleeper...))
	e.sh(t, ctr, "cp /bin/busybox /suid && chmod 4755 /suid")

	upper := upperDirOf(t, ctr)
	if _, err := os.Stat(filepath.Join(upper, "suid")); err != nil {
		t.Fatalf("the file the container wrote is not in its upper dir %s: %v", upper, err)
	}
	assertNobodyCan(t, true, "ls", "-ld", filepath.Join(e.d.Root, "meta.db"))
	assertNobodyCan(t, false, "ls", "-ld", filepath.Join(upper, "suid"))

	containers := filepath.Join(e.d.Root, "containers")
	for _, d := range []string{containers, filepath.Dir(upper)} {
		assertMode(t, d, 0o700)
	}
	if err := os.Chmod(containers, 0o755); err != nil {
		t.Fatal(err)
	}
	e.d.Restart()
	assertMode(t, containers, 0o700)
	assertNobodyCan(t, false, "ls", "-ld", filepath.Join(upper, "suid"))

	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// openToEveryone lets every user search dir and its parents (test temp
// folders are 0700), restoring their modes when t ends.
func openToEveryone(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 != 0 {
			continue
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o005); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(d, fi.Mode().Perm()) })
	}
}

// upperDirOf finds a container's writable layer where any host user can:
// in the options of its overlay mount in /proc/self/mountinfo.
func upperDirOf(t *testing.T, ctr string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		for opt := range strings.SplitSeq(line, ",") {
			if dir, ok := strings.CutPrefix(opt, "upperdir="); ok && strings.Contains(dir, ctr) {
				return dir
			}
		}
	}
	t.Fatalf("no overlay mount of container %s in /proc/self/mountinfo", ctr)
	return ""
}

// assertNobodyCan runs cmd as the host user nobody (65534, no groups) and
// checks whether it succeeds.
func assertNobodyCan(t *testing.T, want bool, cmd ...string) {
	t.Helper()
	c := exec.Command(cmd[0], cmd[1:]...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := c.CombinedOutput()
	if (err == nil) != want {
		t.Errorf("as nobody %q: err %v, output %q; want success %v", cmd, err, out, want)
	}
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s has mode %#o, want %#o", path, got, want)
	}
}
