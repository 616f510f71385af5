package integration

import (
	"testing"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestUserNamespaceOnHostNetworkRefused: a pod with a user namespace of its
// own on the host's network (the kubelet sends it only where Status
// advertises user_namespaces_host_network, which berth does not: the
// kernel mounts sysfs only for the user namespace owning the network
// namespace) is refused at RunPodSandbox, naming the field, and leaves
// nothing behind; before, every container of it failed in runc with EPERM
// mounting /sys.
func TestUserNamespaceOnHostNetworkRefused(t *testing.T) {
	t.Parallel()
	e := startPodEnvWith(t, v1.Config{}, harness.Options{State: stateOnTmpfs(t)})
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetFeatures().GetUserNamespacesHostNetwork() {
		t.Fatal("Status advertises user_namespaces_host_network")
	}
	cfg := e.podConfig("userns-hostnet")
	m := rootMapping(usernsHost, 65536)
	usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
	cfg.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_NODE
	_, err = e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	want := "namespace_options.userns_options.mode POD with network NODE"
	if !st.GetRuntimeHandlers()[0].GetFeatures().GetUserNamespaces() {
		want = "namespace_options.userns_options.mode POD" // the kernel cannot: refused for that first
	}
	assertCode(t, err, one(codes.FailedPrecondition), want)
	e.assertNoLeaks(t)
}
