package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// records reads settings back as "key=value" lines.
func records(b []byte) string {
	return strings.ReplaceAll(string(b), "\x00", "\n")
}

func TestExecSettings(t *testing.T) {
	var base Settings
	for _, kv := range [][2]string{{"uid", "1000"}, {"gid", "1000"}, {"group", "5"}, {"cwd", "/srv"},
		{"env", "PATH=/bin"}, {"env", "A=1"}, {"env", "HOME=/home/x"}, {"env", "A=2"}, {"cap_eff", "0"},
		{"cgroup", "/sys/fs/cgroup/pod/ctr"}} {
		base.Add(kv[0], kv[1])
	}
	b, err := base.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if got := settingsValues(b, "env"); strings.Join(got, " ") != "PATH=/bin A=1 HOME=/home/x A=2" {
		t.Errorf("settingsValues(env) = %q", got)
	}
	for _, c := range []struct {
		name          string
		req           ExecRequest
		tty, inCgroup bool
		want          string
	}{
		{"the container's, env deduplicated (the last wins)", ExecRequest{Args: []string{"sh", "-c", "x"}}, false, false,
			"uid=1000\ngid=1000\ngroup=5\ncwd=/srv\ncap_eff=0\ncgroup=/sys/fs/cgroup/pod/ctr\nenv=PATH=/bin\nenv=HOME=/home/x\nenv=A=2\narg=sh\narg=-c\narg=x\n"},
		{"what the request changes; an empty HOME dropped; no cgroup to join", ExecRequest{Args: []string{"id"}, Cwd: "/tmp",
			Env: []string{"HOME=/h", "HOME="}, User: &User{UID: 7, GID: 8, AdditionalGids: []uint32{9}}}, true, true,
			"cap_eff=0\ncwd=/tmp\nuid=7\ngid=8\ngroup=9\narg=id\ntty=1\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ExecSettings(b, &c.req, c.tty, c.inCgroup)
			if err != nil || records(got) != c.want {
				t.Errorf("got %q (%v), want %q", records(got), err, c.want)
			}
		})
	}
	// A NUL would end its record early and start a forged one.
	for _, req := range []ExecRequest{
		{Args: []string{"sh", "x\x00uid=0"}},
		{Args: []string{"sh"}, Env: []string{"A=x\x00uid=0"}},
		{},
	} {
		if got, err := ExecSettings(b, &req, false, false); err == nil {
			t.Errorf("%q: settings %q, want an error", req.Args, records(got))
		}
	}
}

// TestCloneableCgroup: an exec init is cloned into the container's cgroup
// only when that is its one cgroup and a cgroup v2 one; cgroup v1 (one
// folder per hierarchy) and anything else leave the move to the exec init.
func TestCloneableCgroup(t *testing.T) {
	unified := "/sys/fs/cgroup"
	var st unix.Statfs_t
	if unix.Statfs(unified, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		unified = "/sys/fs/cgroup/unified" // a hybrid host's v2 hierarchy
		if unix.Statfs(unified, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			t.Skip("no cgroup v2 hierarchy mounted")
		}
	}
	settings := func(dirs ...string) []byte {
		var s Settings
		s.Add("uid", "0")
		for _, d := range dirs {
			s.Add("cgroup", d)
		}
		b, err := s.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	plain := t.TempDir()
	v1 := filepath.Join("/sys/fs/cgroup", "pids")
	if _, err := os.Stat(v1); err != nil {
		v1 = plain
	}
	for _, c := range []struct {
		name string
		dirs []string
		want string
	}{
		{"one v2 cgroup", []string{unified}, unified},
		{"none", nil, ""},
		{"a folder that is no cgroup", []string{plain}, ""},
		{"v1, or v2 beside v1", []string{v1, unified}, ""},
		{"missing", []string{filepath.Join(unified, "no-such-cgroup")}, ""},
	} {
		if got := CloneableCgroup(settings(c.dirs...)); got != c.want {
			t.Errorf("%s: CloneableCgroup(%q) = %q, want %q", c.name, c.dirs, got, c.want)
		}
	}
}
