package spec

import (
	"path/filepath"
	"slices"
	"testing"

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

func TestMaskedReadonlyPaths(t *testing.T) {
	in := baseInput(t)
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Linux.MaskedPaths, DefaultMaskedPaths) || !slices.Equal(s.Linux.ReadonlyPaths, DefaultReadonlyPaths) {
		t.Fatalf("masked %q readonly %q", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	for _, p := range []string{"/proc/kcore", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"} {
		if !slices.Contains(s.Linux.MaskedPaths, p) {
			t.Errorf("%s not masked", p)
		}
	}

	sc := secCtx(&in)
	sc.MaskedPaths = []string{"/proc/only"}
	sc.ReadonlyPaths = []string{"/proc/ro"}
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Linux.MaskedPaths, []string{"/proc/only"}) || !slices.Equal(s.Linux.ReadonlyPaths, []string{"/proc/ro"}) {
		t.Fatalf("masked %q readonly %q", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}

	sc.Privileged = true
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.MaskedPaths) != 0 || len(s.Linux.ReadonlyPaths) != 0 {
		t.Fatalf("privileged: masked %q readonly %q", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
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
