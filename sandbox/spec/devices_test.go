package spec

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func needDevNull(t *testing.T) {
	t.Helper()
	if fi, err := os.Stat("/dev/null"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Skip("no /dev/null character device here")
	}
}

func isRule(r specs.LinuxDeviceCgroup, allow bool, typ string, major, minor int64, access string) bool {
	eq := func(p *int64, v int64) bool { return (p == nil && v == -1) || (p != nil && *p == v) }
	return r.Allow == allow && r.Type == typ && eq(r.Major, major) && eq(r.Minor, minor) && r.Access == access
}

func TestDefaultDeviceRules(t *testing.T) {
	in := baseInput(t)
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	rules := s.Linux.Resources.Devices
	if len(rules) == 0 || !isRule(rules[0], false, "", -1, -1, "rwm") {
		t.Fatalf("first rule %+v is not deny-all", rules)
	}
	for name, want := range map[string][2]int64{
		"null": {1, 3}, "zero": {1, 5}, "full": {1, 7}, "random": {1, 8}, "urandom": {1, 9},
		"tty": {5, 0}, "ptmx": {5, 2}, "pts": {136, -1},
	} {
		found := false
		for _, r := range rules[1:] {
			found = found || isRule(r, true, "c", want[0], want[1], "rwm")
		}
		if !found {
			t.Errorf("no allow rule for /dev/%s", name)
		}
	}
	if len(s.Linux.Devices) != 0 {
		t.Fatalf("devices %+v", s.Linux.Devices)
	}
}

func TestCRIDevices(t *testing.T) {
	needDevNull(t)
	dir := t.TempDir()
	symlink(t, "/dev/null", filepath.Join(dir, "mynull"))
	in := baseInput(t)
	in.Config.Devices = []*runtimeapi.Device{
		{HostPath: filepath.Join(dir, "mynull"), ContainerPath: "/dev/xnull", Permissions: "rw"},
		{HostPath: "/dev/zero", Permissions: ""},
	}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Devices) != 2 {
		t.Fatalf("devices %+v", s.Linux.Devices)
	}
	d := s.Linux.Devices[0]
	if d.Path != "/dev/xnull" || d.Type != "c" || d.Major != 1 || d.Minor != 3 || d.FileMode == nil || *d.FileMode != 0o666 || d.UID == nil || d.GID == nil {
		t.Fatalf("device %+v", d)
	}
	if z := s.Linux.Devices[1]; z.Path != "/dev/zero" || z.Major != 1 || z.Minor != 5 {
		t.Fatalf("device %+v", z)
	}
	rules := s.Linux.Resources.Devices
	if !isRule(rules[len(rules)-2], true, "c", 1, 3, "rw") || !isRule(rules[len(rules)-1], true, "c", 1, 5, "rwm") {
		t.Fatalf("rules %+v", rules[len(rules)-2:])
	}
}

func TestCRIDeviceErrors(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "plain"), "x")
	missing := filepath.Join(dir, "gone")
	for _, tc := range []struct {
		d   *runtimeapi.Device
		err []string
	}{
		{&runtimeapi.Device{HostPath: missing, ContainerPath: "/dev/x", Permissions: "rwm"}, []string{missing, "does not exist"}},
		{&runtimeapi.Device{HostPath: filepath.Join(dir, "plain"), ContainerPath: "/dev/x"}, []string{"plain", "not a device"}},
		{&runtimeapi.Device{HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "rwx"}, []string{`"rwx"`}},
		{&runtimeapi.Device{HostPath: "dev/null", ContainerPath: "/dev/x"}, []string{`"dev/null"`}},
		{&runtimeapi.Device{HostPath: "/dev/null", ContainerPath: "x"}, []string{`"x"`}},
	} {
		in := baseInput(t)
		in.Config.Devices = []*runtimeapi.Device{tc.d}
		_, err := Generate(in)
		wantErr(t, err, tc.err...)
	}
}

func TestPrivilegedDevices(t *testing.T) {
	needDevNull(t)
	in := baseInput(t)
	secCtx(&in).Privileged = true
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	rules := s.Linux.Resources.Devices
	if len(rules) != 1 || !isRule(rules[0], true, "", -1, -1, "rwm") {
		t.Fatalf("rules %+v, want allow-all", rules)
	}
	found := false
	for _, d := range s.Linux.Devices {
		found = found || (d.Path == "/dev/null" && d.Major == 1 && d.Minor == 3)
		if d.Path == "/dev/console" || filepath.Dir(d.Path) == "/dev/pts" {
			t.Fatalf("host device %s passed through", d.Path)
		}
	}
	if !found {
		t.Fatalf("/dev/null not among the host devices %+v", s.Linux.Devices)
	}
}
