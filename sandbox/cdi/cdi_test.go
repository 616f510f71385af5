package cdi

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-runtime/berth/cri/errkind"
)

func writeSpec(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

const nullSpec = `cdiVersion: "0.6.0"
kind: vendor.com/dev
devices:
- name: zero
  containerEdits:
    deviceNodes: [{path: /dev/cdi-null, hostPath: /dev/null}]
`

// Devices follows the folders as they change, without a restart.
func TestDevicesRereadsFolders(t *testing.T) {
	dir := t.TempDir()
	r := New([]string{dir, filepath.Join(dir, "not-yet")})
	if got := r.Devices(); len(got) != 0 {
		t.Errorf("empty folder: devices %q", got)
	}
	writeSpec(t, filepath.Join(dir, "a.yaml"), nullSpec)
	if err := os.Mkdir(filepath.Join(dir, "not-yet"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeSpec(t, filepath.Join(dir, "not-yet", "b.yaml"), strings.ReplaceAll(nullSpec, "vendor.com", "other.org"))
	if got, want := r.Devices(), []string{"other.org/dev=zero", "vendor.com/dev=zero"}; !slices.Equal(got, want) {
		t.Errorf("devices %q, want %q", got, want)
	}
	if got := (*Registry)(nil).Devices(); got != nil {
		t.Errorf("nil registry: devices %q", got)
	}
}

// An unknown device names itself and the spec files that failed to load;
// a spec berth cannot honour is refused too.
func TestInjectRefusals(t *testing.T) {
	dir := t.TempDir()
	writeSpec(t, filepath.Join(dir, "good.yaml"), nullSpec)
	writeSpec(t, filepath.Join(dir, "broken.yaml"), "cdiVersion: [")
	writeSpec(t, filepath.Join(dir, "net.yaml"), `cdiVersion: "1.1.0"
kind: vendor.com/nic
devices:
- name: eth
  containerEdits:
    netDevices: [{hostInterfaceName: eth9, name: eth9}]
`)
	r := New([]string{dir})
	for device, mentions := range map[string][]string{
		"vendor.com/dev=gone": {"vendor.com/dev=gone", "not defined", "broken.yaml"},
		"vendor.com/nic=eth":  {"vendor.com/nic=eth", "network devices"},
	} {
		err := r.Inject(&specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}, []string{"vendor.com/dev=zero", device})
		if err == nil || !errors.Is(err, errkind.FailedPrecondition) {
			t.Fatalf("%s: got %v, want FailedPrecondition", device, err)
		}
		for _, m := range mentions {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: error %q does not mention %q", device, err, m)
			}
		}
	}
	s := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	if err := r.Inject(s, []string{"vendor.com/dev=zero"}); err != nil || len(s.Linux.Devices) != 1 {
		t.Errorf("a good device beside broken specs: %v, devices %+v", err, s.Linux.Devices)
	}
}
