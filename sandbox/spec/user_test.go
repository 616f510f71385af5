package spec

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func i64v(v int64) *runtimeapi.Int64Value { return &runtimeapi.Int64Value{Value: v} }

func TestResolveUser(t *testing.T) {
	for _, tc := range []struct {
		name  string
		image string
		sc    *runtimeapi.LinuxContainerSecurityContext
		want  specs.User
	}{
		{name: "empty is root", want: specs.User{UID: 0, GID: 0, AdditionalGids: []uint32{0, 10}}},
		{name: "numeric in passwd", image: "1002", want: specs.User{UID: 1002, GID: 1002, AdditionalGids: []uint32{1002, 50, 44}}},
		{name: "name", image: "www-data", want: specs.User{UID: 33, GID: 33, AdditionalGids: []uint32{33, 50}}},
		{name: "numeric pair not in passwd", image: "1003:1004", want: specs.User{UID: 1003, GID: 1004, AdditionalGids: []uint32{1004}}},
		{name: "numeric not in passwd", image: "4000", want: specs.User{UID: 4000, GID: 0, AdditionalGids: []uint32{0}}},
		{name: "names", image: "www-data:staff", want: specs.User{UID: 33, GID: 50, AdditionalGids: []uint32{50}}},
		{name: "name and gid", image: "bob:44", want: specs.User{UID: 1005, GID: 44, AdditionalGids: []uint32{44}}},
		{
			name: "run_as_username wins over image", image: "www-data",
			sc:   &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: "alice"},
			want: specs.User{UID: 1002, GID: 1002, AdditionalGids: []uint32{1002, 50, 44}},
		},
		{
			name: "run_as_user wins over image user and group", image: "alice:staff",
			sc:   &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64v(33)},
			want: specs.User{UID: 33, GID: 33, AdditionalGids: []uint32{33, 50}},
		},
		{
			name: "run_as_user with run_as_group and supplemental groups", image: "www-data",
			sc: &runtimeapi.LinuxContainerSecurityContext{
				RunAsUser: i64v(1002), RunAsGroup: i64v(3000), SupplementalGroups: []int64{4000, 50},
			},
			want: specs.User{UID: 1002, GID: 3000, AdditionalGids: []uint32{3000, 50, 44, 4000}},
		},
		{
			name: "run_as_username with run_as_group",
			sc:   &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: "bob", RunAsGroup: i64v(7)},
			want: specs.User{UID: 1005, GID: 7, AdditionalGids: []uint32{7}},
		},
		{
			name: "strict policy ignores /etc/group",
			sc: &runtimeapi.LinuxContainerSecurityContext{
				RunAsUser: i64v(1002), SupplementalGroups: []int64{4000},
				SupplementalGroupsPolicy: runtimeapi.SupplementalGroupsPolicy_Strict,
			},
			want: specs.User{UID: 1002, GID: 1002, AdditionalGids: []uint32{1002, 4000}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRootfs(t, testPasswd, testGroup)
			got, err := ResolveUser(root, ocispec.ImageConfig{User: tc.image}, tc.sc)
			if err != nil {
				t.Fatal(err)
			}
			if got.UID != tc.want.UID || got.GID != tc.want.GID || !slices.Equal(got.AdditionalGids, tc.want.AdditionalGids) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestResolveUserErrors(t *testing.T) {
	root := fakeRootfs(t, testPasswd, testGroup)
	for _, tc := range []struct {
		image string
		sc    *runtimeapi.LinuxContainerSecurityContext
		err   []string
	}{
		{image: "nobody-here", err: []string{`"nobody-here"`, "/etc/passwd"}},
		{image: "alice:nogroup", err: []string{`"nogroup"`, "/etc/group"}},
		{sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: "ghost"}, err: []string{`"ghost"`}},
		{sc: &runtimeapi.LinuxContainerSecurityContext{RunAsGroup: i64v(5)}, err: []string{"run_as_group", "without run_as_user"}},
		{image: "alice", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsGroup: i64v(5)}, err: []string{"run_as_group"}},
		{sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64v(-1)}, err: []string{"run_as_user"}},
		{sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64v(1), SupplementalGroups: []int64{-3}}, err: []string{"supplemental_groups"}},
		{image: ":staff", err: []string{"user[:group]"}},
	} {
		_, err := ResolveUser(root, ocispec.ImageConfig{User: tc.image}, tc.sc)
		wantErr(t, err, tc.err...)
	}
}

func TestResolveUserWithoutPasswd(t *testing.T) {
	root := fakeRootfs(t, "", "")
	u, err := ResolveUser(root, ocispec.ImageConfig{User: "1234"}, nil)
	if err != nil || u.UID != 1234 || u.GID != 0 || !slices.Equal(u.AdditionalGids, []uint32{0}) {
		t.Fatalf("got %+v, %v", u, err)
	}
	u, err = ResolveUser(root, ocispec.ImageConfig{User: "1234:99"}, nil)
	if err != nil || u.UID != 1234 || u.GID != 99 {
		t.Fatalf("got %+v, %v", u, err)
	}
	u, err = ResolveUser(root, ocispec.ImageConfig{}, &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64v(5), SupplementalGroups: []int64{8}})
	if err != nil || u.UID != 5 || !slices.Equal(u.AdditionalGids, []uint32{0, 8}) {
		t.Fatalf("got %+v, %v", u, err)
	}
	_, err = ResolveUser(root, ocispec.ImageConfig{User: "www-data"}, nil)
	wantErr(t, err, `"www-data"`)
}

// The image's /etc/passwd and /etc/group are symlinks that try to leave the
// rootfs; the files outside must never be read.
func TestResolveUserSymlinkEscape(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		for _, target := range []string{"/etc/../../outside", "../../outside", "../../../../../outside", "/../outside"} {
			root := fakeRootfs(t, "", "")
			outside := filepath.Join(filepath.Dir(root), "outside")
			writeFile(t, outside, "evil:x:4242:4242::/:/bin/sh\nroot:x:0:4242::/:/bin/sh\n")
			symlink(t, target, filepath.Join(root, "etc/passwd"))
			symlink(t, target, filepath.Join(root, "etc/group"))

			if u, err := ResolveUser(root, ocispec.ImageConfig{User: "evil"}, nil); err == nil {
				t.Fatalf("target %s: read the file outside the rootfs: %+v", target, u)
			}
			// Root's gid would be 4242 if the outside file were read.
			u, err := ResolveUser(root, ocispec.ImageConfig{}, nil)
			if err != nil || u.GID != 0 {
				t.Fatalf("target %s: got %+v, %v", target, u, err)
			}
		}
	})
}

// Absolute and relative symlinks that stay inside the rootfs resolve as the
// container sees them.
func TestResolveUserSymlinkInside(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root := fakeRootfs(t, "", "")
		writeFile(t, filepath.Join(root, "usr/lib/passwd"), testPasswd)
		writeFile(t, filepath.Join(root, "usr/lib/group"), testGroup)
		symlink(t, "/usr/lib/passwd", filepath.Join(root, "etc/passwd"))
		symlink(t, "../usr/./lib/group", filepath.Join(root, "etc/group"))
		u, err := ResolveUser(root, ocispec.ImageConfig{User: "alice:staff"}, nil)
		if err != nil || u.UID != 1002 || u.GID != 50 || !slices.Equal(u.AdditionalGids, []uint32{50, 44}) {
			t.Fatalf("got %+v, %v", u, err)
		}
		// A symlinked directory with an absolute target, too.
		root2 := filepath.Join(t.TempDir(), "r")
		writeFile(t, filepath.Join(root2, "real/passwd"), testPasswd)
		symlink(t, "/real", filepath.Join(root2, "etc"))
		u, err = ResolveUser(root2, ocispec.ImageConfig{User: "bob"}, nil)
		if err != nil || u.UID != 1005 || u.GID != 100 {
			t.Fatalf("got %+v, %v", u, err)
		}
	})
}

func TestResolveUserSymlinkLoop(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root := fakeRootfs(t, "", "")
		symlink(t, "/etc/a", filepath.Join(root, "etc/passwd"))
		symlink(t, "/etc/passwd", filepath.Join(root, "etc/a"))
		_, err := ResolveUser(root, ocispec.ImageConfig{User: "alice"}, nil)
		wantErr(t, err, "/etc/passwd")
	})
}

// A FIFO as /etc/passwd must not block; a directory is refused.
func TestResolveUserNotRegular(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root := fakeRootfs(t, "", "")
		if err := syscall.Mkfifo(filepath.Join(root, "etc/passwd"), 0o644); err != nil {
			t.Skip("mkfifo:", err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := ResolveUser(root, ocispec.ImageConfig{User: "alice"}, nil)
			done <- err
		}()
		select {
		case err := <-done:
			wantErr(t, err, "not a regular file")
		case <-time.After(5 * time.Second):
			t.Fatal("ResolveUser blocked on a FIFO")
		}
		if err := os.Remove(filepath.Join(root, "etc/passwd")); err != nil {
			t.Fatal(err)
		}
		mustMkdir(t, filepath.Join(root, "etc/passwd"))
		_, err := ResolveUser(root, ocispec.ImageConfig{User: "alice"}, nil)
		wantErr(t, err, "not a regular file")
	})
}
