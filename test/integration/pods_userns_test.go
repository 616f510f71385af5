package integration

import (
	"fmt"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestUsernsOptionsRefused sends user-namespace requests berth cannot
// honour: each RunPodSandbox fails with the field named and leaves nothing
// behind, and a pod with mode NODE runs in the host's user namespace.
func TestUsernsOptionsRefused(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	idmap := func(container, host, length uint32) []*runtimeapi.IDMapping {
		return []*runtimeapi.IDMapping{{ContainerId: container, HostId: host, Length: length}}
	}
	good := idmap(0, 100000, 65536)
	const field = "namespace_options.userns_options"
	for _, c := range []struct {
		name    string
		opts    *runtimeapi.UserNamespace
		code    codes.Code
		mention string
	}{
		{"mode-container", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_CONTAINER, Uids: good, Gids: good},
			codes.InvalidArgument, field + ".mode CONTAINER"},
		{"mode-target", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_TARGET, Uids: good, Gids: good},
			codes.InvalidArgument, field + ".mode TARGET"},
		{"two-uid-mappings", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD,
			Uids: append(idmap(0, 100000, 1000), idmap(1000, 200000, 1000)...), Gids: good},
			codes.InvalidArgument, field + ".uids: want exactly one mapping"},
		{"root-unmapped", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good, Gids: idmap(1, 100000, 65536)},
			codes.InvalidArgument, field + ".gids: container ID 0 is not mapped"},
		{"no-gids", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good},
			codes.InvalidArgument, field + ".gids: want exactly one mapping"},
		{"node-with-mappings", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE, Uids: good, Gids: good},
			codes.InvalidArgument, field + ": mode NODE takes no uids or gids"},
		{"pod-unsupported", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good, Gids: good},
			codes.FailedPrecondition, field + ".mode POD"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.podConfig("userns-" + c.name)
			cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: c.opts}}
			_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
			assertCode(t, err, one(c.code), c.mention)
			e.assertNoLeaks(t)
		})
	}

	t.Run("mode-node", func(t *testing.T) {
		cfg := e.podConfig("userns-node")
		cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE}}}
		pod := e.runPod(t, cfg)
		ctr := e.runContainer(t, pod, cfg, e.ctrConfig("node", sleeper...))
		if r := e.exec(t, ctr, "/bin/cat", "/proc/self/uid_map"); r.code != 0 || !isIdentityMap(r.stdout) {
			t.Errorf("uid_map of a mode NODE pod: exit %d, %q; want the host's identity map", r.code, r.stdout)
		}
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
		e.assertNoLeaks(t)
	})
}

// isIdentityMap tells the initial user namespace's map, "0 0 4294967295".
func isIdentityMap(uidMap string) bool {
	var inside, outside, length uint64
	n, _ := fmt.Sscan(uidMap, &inside, &outside, &length)
	return n == 3 && inside == 0 && outside == 0 && length == 1<<32-1
}
