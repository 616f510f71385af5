package spec

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/cdi"
)

func TestRequestedCDIDevices(t *testing.T) {
	got, err := requestedCDIDevices(
		[]*runtimeapi.CDIDevice{{Name: "vendor.com/gpu=1"}, {Name: "vendor.com/gpu=0"}, {Name: "vendor.com/gpu=1"}},
		map[string]string{
			"cdi.k8s.io/plugin-b": "vendor.com/gpu=0,vendor.com/nic=eth",
			"cdi.k8s.io/plugin-a": "other.org/dev=x",
			"unrelated":           "not a device",
		})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vendor.com/gpu=1", "vendor.com/gpu=0", "other.org/dev=x", "vendor.com/nic=eth"}
	if !slices.Equal(got, want) {
		t.Errorf("devices = %q, want %q (the field's in order, then the annotations' sorted, each once)", got, want)
	}
	for _, bad := range []struct {
		field       []*runtimeapi.CDIDevice
		annotations map[string]string
		mention     string
	}{
		{[]*runtimeapi.CDIDevice{{Name: "vendor.com/gpu=0"}, {Name: "gpu0"}}, nil, `CDI_devices[1].name "gpu0"`},
		{nil, map[string]string{"cdi.k8s.io/p": "vendor.com/gpu"}, "cdi.k8s.io/"},
	} {
		_, err := requestedCDIDevices(bad.field, bad.annotations)
		wantErr(t, err, bad.mention)
		if !errors.Is(err, errkind.Invalid) {
			t.Errorf("%v: want kind Invalid", err)
		}
	}
}

// A container that asks for CDI devices is refused when berth has no CDI
// folders, naming the devices; one that asks for none is not affected.
func TestGenerateCDIWithoutFolders(t *testing.T) {
	in := baseInput(t)
	if _, err := Generate(in); err != nil {
		t.Fatalf("no CDI devices asked for: %v", err)
	}
	in.Config.CDIDevices = []*runtimeapi.CDIDevice{{Name: "vendor.com/gpu=0"}}
	for _, reg := range []*cdi.Registry{nil, cdi.New(nil)} {
		in.CDI = reg
		_, err := Generate(in)
		wantErr(t, err, "vendor.com/gpu=0", "spec_dirs")
		if !errors.Is(err, errkind.FailedPrecondition) {
			t.Errorf("%v: want kind FailedPrecondition", err)
		}
	}
}

// Generate applies a CDI device after berth's own: its node and its allow
// rule come after the default rules (so the deny-all does not undo it).
func TestGenerateCDIDevice(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "v.yaml"), `cdiVersion: "0.7.0"
kind: vendor.com/dev
devices:
- name: one
  containerEdits:
    deviceNodes:
    - path: /dev/one
      hostPath: /dev/null
    env: ["ONE=1"]
    additionalGids: [4242]
`)
	in := baseInput(t)
	in.CDI = cdi.New([]string{dir})
	in.Config.Annotations = map[string]string{"cdi.k8s.io/test": "vendor.com/dev=one"}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/one" })
	if i < 0 || s.Linux.Devices[i].Major != 1 || s.Linux.Devices[i].Minor != 3 {
		t.Fatalf("devices %+v lack /dev/one 1:3", s.Linux.Devices)
	}
	rules := s.Linux.Resources.Devices
	last := rules[len(rules)-1]
	if !last.Allow || last.Type != "c" || *last.Major != 1 || *last.Minor != 3 || last.Access != "rwm" || rules[0].Allow {
		t.Errorf("device rules %+v: want the deny-all first and c 1:3 rwm allowed last", rules)
	}
	if !slices.Contains(s.Process.Env, "ONE=1") || !slices.Contains(s.Process.User.AdditionalGids, 4242) {
		t.Errorf("env %q, groups %v: want ONE=1 and 4242", s.Process.Env, s.Process.User.AdditionalGids)
	}
	if err := os.Remove(filepath.Join(dir, "v.yaml")); err != nil {
		t.Fatal(err)
	}
	_, err = Generate(in)
	wantErr(t, err, "vendor.com/dev=one", dir)
	if !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("%v: want kind FailedPrecondition once the spec is gone", err)
	}
}
