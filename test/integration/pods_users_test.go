package integration

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerUsers checks the identity a container runs with, from the
// image's User or the security context, resolved in the image's
// /etc/passwd and /etc/group (harness.Passwd, harness.Group: www-data is
// 33, berth is 1002 and a member of extra, 1004), as the process sees it
// and as ContainerStatus reports it; and the refusals.
func TestContainerUsers(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	images := map[string]string{"": e.image}
	for _, u := range []string{"1002", "www-data", "1003:1004", "ghost"} {
		images[u] = e.pushImage(t, "berth/busybox:user-"+strings.ReplaceAll(u, ":", "-"), v1.Config{User: u})
	}
	cfg := e.podConfig("users")
	pod := e.runPod(t, cfg)

	i64 := func(v int64) *runtimeapi.Int64Value { return &runtimeapi.Int64Value{Value: v} }
	for _, c := range []struct {
		name      string
		imageUser string
		sc        *runtimeapi.LinuxContainerSecurityContext
		uid, gid  int64
		groups    []int64
		err       string // a refusal naming this
	}{
		{name: "image-default-root", uid: 0, gid: 0, groups: []int64{0}},
		{name: "image-uid", imageUser: "1002", uid: 1002, gid: 1002, groups: []int64{1002, 1004}},
		{name: "image-name", imageUser: "www-data", uid: 33, gid: 33, groups: []int64{33}},
		{name: "image-uid-gid", imageUser: "1003:1004", uid: 1003, gid: 1004, groups: []int64{1004}},
		{name: "run-as-user", imageUser: "www-data", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64(1002)},
			uid: 1002, gid: 1002, groups: []int64{1002, 1004}},
		{name: "run-as-user-not-in-passwd", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64(4242)},
			uid: 4242, gid: 0, groups: []int64{0}},
		{name: "run-as-username", imageUser: "1002", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: "www-data"},
			uid: 33, gid: 33, groups: []int64{33}},
		{name: "run-as-group", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64(1002), RunAsGroup: i64(1004)},
			uid: 1002, gid: 1004, groups: []int64{1004}},
		{name: "run-as-username-and-group", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: "www-data", RunAsGroup: i64(1004)},
			uid: 33, gid: 1004, groups: []int64{1004}},
		{name: "supplemental-groups", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUser: i64(1002), SupplementalGroups: []int64{3000, 2000, 1004}},
			uid: 1002, gid: 1002, groups: []int64{1002, 1004, 3000, 2000}},
		{name: "merge-policy", imageUser: "1002", sc: &runtimeapi.LinuxContainerSecurityContext{SupplementalGroups: []int64{3000},
			SupplementalGroupsPolicy: runtimeapi.SupplementalGroupsPolicy_Merge}, uid: 1002, gid: 1002, groups: []int64{1002, 1004, 3000}},
		{name: "strict-policy", imageUser: "1002", sc: &runtimeapi.LinuxContainerSecurityContext{SupplementalGroups: []int64{3000},
			SupplementalGroupsPolicy: runtimeapi.SupplementalGroupsPolicy_Strict}, uid: 1002, gid: 1002, groups: []int64{1002, 3000}},
		{name: "strict-policy-run-as-username", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: "berth",
			SupplementalGroupsPolicy: runtimeapi.SupplementalGroupsPolicy_Strict}, uid: 1002, gid: 1002, groups: []int64{1002}},
		{name: "group-without-user", imageUser: "1002", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsGroup: i64(1004)}, err: "run_as_group"},
		{name: "unknown-username", sc: &runtimeapi.LinuxContainerSecurityContext{RunAsUsername: "nobody-here"}, err: "nobody-here"},
		{name: "unknown-image-user", imageUser: "ghost", err: "ghost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc := e.ctrConfig(c.name, "/bin/sh", "-c", "id -u; id -g; grep ^Groups: /proc/self/status; id -G")
			cc.Image.Image = images[c.imageUser]
			cc.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: c.sc}
			if c.err != "" {
				_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
				assertCode(t, err, one(codes.InvalidArgument), c.err)
				if ids := e.listContainerIDs(t, &runtimeapi.ContainerFilter{LabelSelector: cc.Labels}); len(ids) != 0 {
					t.Errorf("the refused container is listed: %v", ids)
				}
				return
			}
			st, out := e.runToExit(t, pod, cfg, cc)
			if st.ExitCode != 0 {
				t.Fatalf("exit code %d, output %q", st.ExitCode, out)
			}
			// The kernel keeps the groups sorted.
			groups := slices.Sorted(slices.Values(c.groups))
			want := strconv.FormatInt(c.uid, 10) + "\n" + strconv.FormatInt(c.gid, 10) + "\nGroups:\t" + joinIDs(groups) + " \n" +
				idG(c.gid, groups) + "\n"
			if out != want {
				t.Errorf("inside: uid, gid, groups =\n%q\nwant\n%q", out, want)
			}
			u := st.GetUser().GetLinux()
			if u.GetUid() != c.uid || u.GetGid() != c.gid || !slices.Equal(u.GetSupplementalGroups(), groups) {
				t.Errorf("ContainerStatus user = %v, want uid %d gid %d groups %v", u, c.uid, c.gid, c.groups)
			}
		})
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// idG is what busybox's id -G prints: the gid, then the other groups.
func idG(gid int64, groups []int64) string {
	return joinIDs(append([]int64{gid}, slices.DeleteFunc(slices.Clone(groups), func(g int64) bool { return g == gid })...))
}

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, " ")
}
