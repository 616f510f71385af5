package server

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/sandbox/shim"
)

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
		var s shim.Settings
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
		if got := cloneableCgroup(settings(c.dirs...)); got != c.want {
			t.Errorf("%s: cloneableCgroup(%q) = %q, want %q", c.name, c.dirs, got, c.want)
		}
	}
}
