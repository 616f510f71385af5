package cri

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/image/registry"
)

func runtimeClient(t *testing.T, cfg Config) runtimeapi.RuntimeServiceClient {
	t.Helper()
	_, conn := startServer(t, ServerOptions{Runtime: NewRuntimeService(cfg, nil, nil)})
	return runtimeapi.NewRuntimeServiceClient(conn)
}

func TestVersion(t *testing.T) {
	got, err := runtimeClient(t, Config{}).Version(context.Background(), &runtimeapi.VersionRequest{Version: "0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "0.1.0" || got.RuntimeName != "berth" || got.RuntimeVersion != RuntimeVersion || got.RuntimeApiVersion != "v1" {
		t.Errorf("Version = %+v", got)
	}
}

func TestStatus(t *testing.T) {
	cfg := Config{
		Root: "/var/lib/berth", State: "/run/berth", Socket: "/run/berth/berth.sock", CgroupDriver: "systemd",
		Registries: map[string]registry.Host{
			"docker.io":      {Mirrors: []string{"http://127.0.0.1:5000"}, Username: "alice", Password: "s3cret-pw"},
			"127.0.0.1:5000": {PlainHTTP: true},
		},
	}
	rt := runtimeClient(t, cfg)
	ctx := context.Background()

	resp, err := rt.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Info != nil {
		t.Errorf("non-verbose Status has info %v", resp.Info)
	}
	conds := map[string]*runtimeapi.RuntimeCondition{}
	for _, c := range resp.GetStatus().GetConditions() {
		conds[c.Type] = c
	}
	if c := conds[runtimeapi.RuntimeReady]; c == nil || !c.Status {
		t.Errorf("RuntimeReady = %v, want true", c)
	}
	if c := conds[runtimeapi.NetworkReady]; c == nil || c.Status || c.Reason != "NoNetwork" || c.Message == "" {
		t.Errorf("NetworkReady = %v, want false with reason NoNetwork", c)
	}

	// Each proved end to end: TestContainerUsers (supplemental groups),
	// TestContainerMountOptions; user namespaces on the host network are not.
	if f := resp.GetFeatures(); !f.GetSupplementalGroupsPolicy() || !f.GetMountOptions() || f.GetUserNamespacesHostNetwork() {
		t.Errorf("Status features %v, want supplemental_groups_policy and mount_options", f)
	}
	if h := resp.GetRuntimeHandlers(); len(h) != 1 || h[0].Name != "" || h[0].GetFeatures() == nil {
		t.Errorf("runtime handlers %v, want the default one with its features", h)
	}

	resp, err = rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	raw := resp.Info["config"]
	if strings.Contains(raw, "s3cret-pw") || strings.Contains(raw, "alice") {
		t.Errorf("verbose config leaks credentials: %s", raw)
	}
	var got verboseConfig
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatalf("info[config] = %q: %v", raw, err)
	}
	if got.Root != cfg.Root || got.State != cfg.State || got.Socket != cfg.Socket ||
		got.CgroupDriver != "systemd" || got.Version != RuntimeVersion {
		t.Errorf("verbose config = %+v", got)
	}
	if r := got.Registries["docker.io"]; !r.Credentials || len(r.Mirrors) != 1 {
		t.Errorf("docker.io in verbose config = %+v", r)
	}
	if r := got.Registries["127.0.0.1:5000"]; !r.PlainHTTP || r.Credentials {
		t.Errorf("127.0.0.1:5000 in verbose config = %+v", r)
	}
}

func TestRuntimeConfig(t *testing.T) {
	for driver, want := range map[string]runtimeapi.CgroupDriver{
		"cgroupfs": runtimeapi.CgroupDriver_CGROUPFS,
		"systemd":  runtimeapi.CgroupDriver_SYSTEMD,
		"":         runtimeapi.CgroupDriver_CGROUPFS,
	} {
		resp, err := runtimeClient(t, Config{CgroupDriver: driver}).RuntimeConfig(context.Background(), &runtimeapi.RuntimeConfigRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetLinux().GetCgroupDriver(); got != want {
			t.Errorf("cgroup_driver %q → %v, want %v", driver, got, want)
		}
	}
}

func TestUnimplemented(t *testing.T) {
	_, err := runtimeClient(t, Config{}).PortForward(context.Background(), &runtimeapi.PortForwardRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("PortForward = %v, want Unimplemented", err)
	}
}

type fakeNetwork struct {
	ok  bool
	why string
}

func (f fakeNetwork) Ready() (bool, string) { return f.ok, f.why }

func TestNetworkCondition(t *testing.T) {
	for _, c := range []struct {
		net    NetworkStatus
		status bool
		reason string
	}{
		{fakeNetwork{ok: true}, true, ""},
		{fakeNetwork{why: "bridge berth0 is missing"}, false, "NetworkNotReady"},
		{nil, false, "NoNetwork"},
	} {
		got := NewRuntimeService(Config{}, nil, c.net).networkCondition()
		if got.Status != c.status || got.Reason != c.reason || !got.Status && got.Message == "" {
			t.Errorf("network %v: condition %v, want status %v reason %q with a message", c.net, got, c.status, c.reason)
		}
	}
}

// featureDecision is whether berth advertises one CRI runtime feature, and
// the test that proves what it advertises.
type featureDecision struct {
	advertised string // "yes", "no", or "kernel": where the kernel probe finds it
	proof      string // a test that shows the feature working, or refused as advertised
}

// featureDecisions covers every field of the CRI's RuntimeFeatures and
// RuntimeHandlerFeatures. The 1.37 kubelet declares NodeDeclaredFeatures
// (component-helpers/nodedeclaredfeatures, read in its
// kubelet_node_declared_features.go) from two of them: mount_options
// (VolumeBindMountOptions) and user_namespaces_host_network
// (UserNamespacesHostNetworkSupport); it reads the rest when it builds pods.
var featureDecisions = map[protoreflect.FullName]featureDecision{
	"runtime.v1.RuntimeFeatures.supplemental_groups_policy": {"yes", "TestContainerUsers"},
	"runtime.v1.RuntimeFeatures.mount_options":              {"yes", "TestContainerMountOptions"},
	// The kernel mounts sysfs only for the user namespace that owns the
	// network namespace; berth does not bind the host's /sys instead.
	"runtime.v1.RuntimeFeatures.user_namespaces_host_network":      {"no", "TestUserNamespaceOnHostNetworkRefused"},
	"runtime.v1.RuntimeHandlerFeatures.recursive_read_only_mounts": {"kernel", "TestRecursiveReadOnlyMount"},
	"runtime.v1.RuntimeHandlerFeatures.user_namespaces":            {"kernel", "TestUserNamespacePod"},
}

// TestRuntimeFeaturesDecided fails when a cri-api upgrade brings a runtime
// feature nobody decided on, and checks that Status advertises what is
// decided: a feature berth has and does not advertise is one the kubelet
// never uses (or declares for the scheduler).
func TestRuntimeFeaturesDecided(t *testing.T) {
	resp, err := runtimeClient(t, Config{}).Status(context.Background(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	tests := testFunctions(t)
	for _, m := range []protoreflect.Message{resp.GetFeatures().ProtoReflect(), (&runtimeapi.RuntimeHandlerFeatures{}).ProtoReflect()} {
		fields := m.Descriptor().Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			d, ok := featureDecisions[f.FullName()]
			switch {
			case !ok:
				t.Errorf("%s: no decision; add it to featureDecisions, advertised or not, with its test", f.FullName())
				continue
			case !tests[d.proof]:
				t.Errorf("%s: proved by %s, but no func %s( is in any _test.go", f.FullName(), d.proof, d.proof)
			}
			if d.advertised != "kernel" && m.Get(f).Bool() != (d.advertised == "yes") {
				t.Errorf("Status advertises %s %v, decided %q", f.FullName(), m.Get(f).Bool(), d.advertised)
			}
		}
	}
}
