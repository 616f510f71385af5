package spec

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func fakeCapLastCap(t *testing.T, v string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cap_last_cap")
	writeFile(t, p, v)
	old := capLastCapPath
	capLastCapPath = p
	t.Cleanup(func() { capLastCapPath = old })
}

func without(set []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(set), func(s string) bool { return slices.Contains(drop, s) })
}

func TestCapabilities(t *testing.T) {
	fakeCapLastCap(t, "40\n")
	for _, tc := range []struct {
		name     string
		add, drp []string
		priv     bool
		want     []string
	}{
		{name: "default", want: DefaultCapabilities},
		{name: "add and drop", add: []string{"NET_ADMIN", "cap_sys_time", "CHOWN"}, drp: []string{"chown", "CAP_KILL"},
			want: append(without(DefaultCapabilities, "CAP_CHOWN", "CAP_KILL"), "CAP_NET_ADMIN", "CAP_SYS_TIME")},
		{name: "add ALL drop one", add: []string{"ALL"}, drp: []string{"CHOWN"}, want: capNames[1:]},
		{name: "drop ALL add one", add: []string{"NET_BIND_SERVICE"}, drp: []string{"all"}, want: []string{"CAP_NET_BIND_SERVICE"}},
		{name: "drop ALL", drp: []string{"ALL"}, want: nil},
		{name: "privileged", priv: true, drp: []string{"ALL"}, want: capNames},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &runtimeapi.LinuxContainerSecurityContext{
				Privileged:   tc.priv,
				Capabilities: &runtimeapi.Capability{AddCapabilities: tc.add, DropCapabilities: tc.drp},
			}
			c, err := capabilities(sc)
			if err != nil {
				t.Fatal(err)
			}
			for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
				if !slices.Equal(set, tc.want) {
					t.Errorf("%s = %q, want %q", name, set, tc.want)
				}
			}
			if len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
				t.Errorf("inheritable %q ambient %q, want none", c.Inheritable, c.Ambient)
			}
		})
	}
}

func TestCapabilitiesKernelLimit(t *testing.T) {
	fakeCapLastCap(t, "37")
	c, err := capabilities(&runtimeapi.LinuxContainerSecurityContext{Privileged: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Bounding) != 38 || c.Bounding[37] != "CAP_AUDIT_READ" {
		t.Fatalf("bounding %q", c.Bounding)
	}
}

func TestCapabilitiesAmbientAndErrors(t *testing.T) {
	c, err := capabilities(&runtimeapi.LinuxContainerSecurityContext{
		Capabilities: &runtimeapi.Capability{AddAmbientCapabilities: []string{"NET_ADMIN"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Ambient, []string{"CAP_NET_ADMIN"}) || !slices.Equal(c.Inheritable, []string{"CAP_NET_ADMIN"}) ||
		!slices.Contains(c.Permitted, "CAP_NET_ADMIN") || !slices.Contains(c.Bounding, "CAP_NET_ADMIN") {
		t.Fatalf("caps %+v", c)
	}
	_, err = capabilities(&runtimeapi.LinuxContainerSecurityContext{
		Capabilities: &runtimeapi.Capability{AddCapabilities: []string{"FLY"}},
	})
	wantErr(t, err, "add_capabilities", `"FLY"`)
	_, err = capabilities(&runtimeapi.LinuxContainerSecurityContext{
		Capabilities: &runtimeapi.Capability{DropCapabilities: []string{"CAP_NOPE"}},
	})
	wantErr(t, err, "drop_capabilities", `"CAP_NOPE"`)
}

// TestMaskedReadonlyPaths checks which /proc paths a container gets masked
// and read-only: the lists as sent, the kubelet's defaults or a list of its
// own; an empty list is its default in the host's user namespace and masks
// nothing in a pod's own (procMount Unmasked); a privileged container has
// none.
func TestMaskedReadonlyPaths(t *testing.T) {
	own, ownRO := []string{"/proc/only"}, []string{"/proc/ro"}
	for _, c := range []struct {
		name                  string
		ownUserNS, privileged bool
		masked, readonly      []string // sent
		wantMasked, wantRO    []string
	}{
		{name: "host userns, none sent", wantMasked: DefaultMaskedPaths, wantRO: DefaultReadonlyPaths},
		{name: "host userns, empty lists", masked: []string{}, readonly: []string{}, wantMasked: DefaultMaskedPaths, wantRO: DefaultReadonlyPaths},
		{name: "host userns, defaults", masked: DefaultMaskedPaths, readonly: DefaultReadonlyPaths, wantMasked: DefaultMaskedPaths, wantRO: DefaultReadonlyPaths},
		{name: "host userns, own lists", masked: own, readonly: ownRO, wantMasked: own, wantRO: ownRO},
		{name: "host userns, masked only", masked: own, wantMasked: own, wantRO: DefaultReadonlyPaths},
		{name: "host userns, privileged", privileged: true},
		{name: "own userns, none sent", ownUserNS: true},
		{name: "own userns, defaults", ownUserNS: true, masked: DefaultMaskedPaths, readonly: DefaultReadonlyPaths, wantMasked: DefaultMaskedPaths, wantRO: DefaultReadonlyPaths},
		{name: "own userns, own lists", ownUserNS: true, masked: own, readonly: ownRO, wantMasked: own, wantRO: ownRO},
		{name: "own userns, privileged", ownUserNS: true, privileged: true, masked: DefaultMaskedPaths},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := baseInput(t)
			if c.ownUserNS {
				m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
				in.UserNS, in.UIDMappings, in.GIDMappings = "/run/berth/ns/user-1", m, m
			}
			sc := secCtx(&in)
			sc.Privileged, sc.MaskedPaths, sc.ReadonlyPaths = c.privileged, c.masked, c.readonly
			s, err := Generate(in)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.Linux.MaskedPaths, c.wantMasked) || !slices.Equal(s.Linux.ReadonlyPaths, c.wantRO) {
				t.Fatalf("masked %q readonly %q, want %q and %q", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths, c.wantMasked, c.wantRO)
			}
			// The spec's lists are its own: a change to them (CDI edits
			// come later) leaves the defaults alone.
			for _, l := range [][]string{s.Linux.MaskedPaths, s.Linux.ReadonlyPaths} {
				if len(l) > 0 {
					l[0] = "/changed"
				}
			}
			if DefaultMaskedPaths[0] != "/proc/acpi" || DefaultReadonlyPaths[0] != "/proc/bus" {
				t.Fatal("the defaults changed through a spec's lists")
			}
		})
	}
	for _, p := range []string{"/proc/kcore", "/proc/timer_list", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"} {
		if !slices.Contains(DefaultMaskedPaths, p) {
			t.Errorf("%s not masked by default", p)
		}
	}
	if !slices.Contains(DefaultReadonlyPaths, "/proc/sys") {
		t.Error("/proc/sys not read-only by default")
	}
}

func TestNoNewPrivsReadonlyRootfs(t *testing.T) {
	in := baseInput(t)
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.NoNewPrivileges || s.Root.Readonly {
		t.Fatal("no_new_privileges / readonly root set by default")
	}
	sc := secCtx(&in)
	sc.NoNewPrivs, sc.ReadonlyRootfs = true, true
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Process.NoNewPrivileges || !s.Root.Readonly || s.Root.Path != in.RootfsPath {
		t.Fatalf("process %+v root %+v", s.Process, s.Root)
	}
}

func TestPauseUser(t *testing.T) {
	id := func(v int64) *runtimeapi.Int64Value { return &runtimeapi.Int64Value{Value: v} }
	const host = 1<<32 - 1 // the host's user namespace maps every ID
	for _, tc := range []struct {
		name       string
		sc         *runtimeapi.LinuxSandboxSecurityContext
		uids, gids uint32
		want       specs.User
		err        string
	}{
		{"default", nil, host, host, specs.User{UID: PauseID, GID: PauseID}, ""},
		{"pod-user-and-group", &runtimeapi.LinuxSandboxSecurityContext{RunAsUser: id(1000), RunAsGroup: id(2000)}, host, host, specs.User{UID: 1000, GID: 2000}, ""},
		{"pod-root", &runtimeapi.LinuxSandboxSecurityContext{RunAsUser: id(0)}, host, host, specs.User{UID: 0, GID: PauseID}, ""},
		// The kubelet sends a pod-level runAsGroup without runAsUser.
		{"group-only", &runtimeapi.LinuxSandboxSecurityContext{RunAsGroup: id(3000)}, host, host, specs.User{UID: PauseID, GID: 3000}, ""},
		{"userns-65536", nil, 65536, 65536, specs.User{UID: PauseID, GID: PauseID}, ""},
		{"userns-short", nil, 1000, 10, specs.User{UID: 999, GID: 9}, ""},
		{"userns-user-mapped", &runtimeapi.LinuxSandboxSecurityContext{RunAsUser: id(999), RunAsGroup: id(0)}, 1000, 1, specs.User{UID: 999, GID: 0}, ""},
		{"userns-user-unmapped", &runtimeapi.LinuxSandboxSecurityContext{RunAsUser: id(1000)}, 1000, 1000, specs.User{},
			"linux.security_context.run_as_user: ID 1000 is not mapped in the pod's user namespace (it maps 0 to 999)"},
		{"userns-group-unmapped", &runtimeapi.LinuxSandboxSecurityContext{RunAsUser: id(1), RunAsGroup: id(5)}, 1000, 5, specs.User{},
			"linux.security_context.run_as_group: ID 5 is not mapped"},
		{"negative-user", &runtimeapi.LinuxSandboxSecurityContext{RunAsUser: id(-1)}, host, host, specs.User{},
			"linux.security_context.run_as_user: invalid ID -1"},
		{"too-large-group", &runtimeapi.LinuxSandboxSecurityContext{RunAsUser: id(1), RunAsGroup: id(1 << 32)}, host, host, specs.User{},
			"linux.security_context.run_as_group: invalid ID 4294967296"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PauseUser(tc.sc, tc.uids, tc.gids)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("PauseUser = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestCheckPrivileged(t *testing.T) {
	priv := &runtimeapi.ContainerConfig{Linux: &runtimeapi.LinuxContainerConfig{
		SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}}}
	plain := &runtimeapi.ContainerConfig{}
	pod := func(sc *runtimeapi.LinuxSandboxSecurityContext) *runtimeapi.PodSandboxConfig {
		return &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: sc}}
	}
	userns := func(mode runtimeapi.NamespaceMode) *runtimeapi.NamespaceOption {
		return &runtimeapi.NamespaceOption{UsernsOptions: &runtimeapi.UserNamespace{Mode: mode}}
	}
	for _, tc := range []struct {
		name string
		pod  *runtimeapi.PodSandboxConfig
		ctr  *runtimeapi.ContainerConfig
		err  string
	}{
		{"plain-in-plain-pod", pod(nil), plain, ""},
		{"privileged-in-privileged-pod", pod(&runtimeapi.LinuxSandboxSecurityContext{Privileged: true}), priv, ""},
		// No userns options at all: POD is the enum's zero value, not asked for.
		{"privileged-pod-no-userns-options", pod(&runtimeapi.LinuxSandboxSecurityContext{Privileged: true, NamespaceOptions: &runtimeapi.NamespaceOption{}}), priv, ""},
		{"privileged-pod-host-userns", pod(&runtimeapi.LinuxSandboxSecurityContext{Privileged: true, NamespaceOptions: userns(runtimeapi.NamespaceMode_NODE)}), priv, ""},
		{"privileged-in-plain-pod", pod(nil), priv, "config.linux.security_context.privileged: the pod is not privileged"},
		{"privileged-in-userns-pod", pod(&runtimeapi.LinuxSandboxSecurityContext{Privileged: true, NamespaceOptions: userns(runtimeapi.NamespaceMode_POD)}), priv,
			"config.linux.security_context.privileged: the pod has its own user namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckPrivileged(tc.pod, tc.ctr)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("CheckPrivileged = %v, want %q", err, tc.err)
			}
		})
	}
}
