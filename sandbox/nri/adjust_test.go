package nri

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func baseSpec() *specs.Spec {
	limit := int64(64 << 20)
	return &specs.Spec{
		Process:     &specs.Process{Env: []string{"PATH=/bin", "GONE=1", "KEEP=1"}, Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 10, Soft: 10}}},
		Annotations: map[string]string{"gone": "x", "kept": "y"},
		Mounts:      []specs.Mount{{Destination: "/proc"}, {Destination: "/data", Source: "/old"}},
		Linux:       &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}},
	}
}

// TestAdjust makes each kind of adjustment berth supports, removals
// included, and keeps what no plugin changed.
func TestAdjust(t *testing.T) {
	s := baseSpec()
	a := &api.ContainerAdjustment{}
	a.AddEnv("NEW", "v")
	a.RemoveEnv("GONE")
	a.AddAnnotation("new", "z")
	a.RemoveAnnotation("gone")
	a.AddMount(&api.Mount{Destination: "/data", Source: "/new", Type: "bind", Options: []string{"rbind"}})
	a.AddRlimit("RLIMIT_NOFILE", 200, 100)
	a.SetLinuxCPUSetCPUs("1")
	a.AddDevice(&api.LinuxDevice{Path: "/dev/x", Type: "c", Major: 1, Minor: 3})
	oom := 7
	a.SetLinuxOomScoreAdj(&oom)
	a.AddHooks(&api.Hooks{Prestart: []*api.Hook{{Path: "/bin/true"}}})
	a.AddCDIDevice(&api.CDIDevice{Name: "vendor.test/dev=one"})
	cdi := &fakeCDI{}
	if err := Adjust(s, a, cdi, anyLimits{}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"vendor.test/dev=one"}; !reflect.DeepEqual(cdi.injected, want) {
		t.Errorf("CDI devices injected %q, want %q", cdi.injected, want)
	}
	if want := []string{"PATH=/bin", "KEEP=1", "NEW=v"}; !reflect.DeepEqual(s.Process.Env, want) {
		t.Errorf("env %q, want %q", s.Process.Env, want)
	}
	if want := map[string]string{"kept": "y", "new": "z"}; !reflect.DeepEqual(s.Annotations, want) {
		t.Errorf("annotations %v, want %v", s.Annotations, want)
	}
	if len(s.Mounts) != 2 || s.Mounts[1].Source != "/new" {
		t.Errorf("mounts %+v, want /data from /new replacing /old", s.Mounts)
	}
	if want := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 200, Soft: 100}}; !reflect.DeepEqual(s.Process.Rlimits, want) {
		t.Errorf("rlimits %+v, want %+v", s.Process.Rlimits, want)
	}
	r := s.Linux.Resources
	if r.CPU == nil || r.CPU.Cpus != "1" || *r.Memory.Limit != 64<<20 {
		t.Errorf("resources %+v: want cpuset 1 and the memory limit kept", r)
	}
	if len(s.Linux.Devices) != 1 || len(r.Devices) != 1 || !r.Devices[0].Allow || *r.Devices[0].Major != 1 {
		t.Errorf("devices %+v, rules %+v: want /dev/x with a rule allowing it", s.Linux.Devices, r.Devices)
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj != 7 {
		t.Errorf("oom_score_adj %v, want 7", s.Process.OOMScoreAdj)
	}
	//lint:ignore SA1019 the protocol's prestart hooks are what is tested
	if s.Hooks == nil || len(s.Hooks.Prestart) != 1 {
		t.Errorf("hooks %+v, want one prestart", s.Hooks)
	}
}

// TestAdjustRefused refuses each adjustment berth does not make, naming
// it, and changes nothing of the spec.
func TestAdjustRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(a *api.ContainerAdjustment)
	}{
		{"linux.sysctl", func(a *api.ContainerAdjustment) { a.SetLinuxSysctl("net.ipv4.ip_forward", "1") }},
		{"linux.cgroups_path", func(a *api.ContainerAdjustment) { a.SetLinuxCgroupsPath("/elsewhere") }},
		{"linux.namespaces", func(a *api.ContainerAdjustment) { a.AddOrReplaceNamespace(&api.LinuxNamespace{Type: "network"}) }},
		{"linux.resources.rdt_class", func(a *api.ContainerAdjustment) { a.SetLinuxRDTClass("gold") }},
		{"linux.resources.memory.kernel", func(a *api.ContainerAdjustment) { a.SetLinuxMemoryKernel(1 << 20) }},
		{"linux.resources.blockio_class", func(a *api.ContainerAdjustment) { a.SetLinuxBlockIOClass("slow") }},
		{"linux.seccomp_policy", func(a *api.ContainerAdjustment) {
			a.SetLinuxSeccompPolicy(&api.LinuxSeccomp{DefaultAction: "SCMP_ACT_ALLOW"})
		}},
		{"NRI adjustment annotations: org.criu.config", func(a *api.ContainerAdjustment) { a.AddAnnotation("org.criu.config", "/tmp/x") }},
		{"NRI adjustment annotations: org.criu.config", func(a *api.ContainerAdjustment) { a.RemoveAnnotation("org.criu.config") }},
		{"mounts[/shared]", func(a *api.ContainerAdjustment) {
			a.AddMount(&api.Mount{Destination: "/shared", Source: "/x", Options: []string{"rbind", "rshared"}})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := baseSpec()
			a := &api.ContainerAdjustment{}
			a.AddEnv("NEW", "v") // made only if the whole adjustment is
			c.set(a)
			err := Adjust(s, a, &fakeCDI{}, anyLimits{})
			if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), c.name) {
				t.Fatalf("Adjust: %v, want FailedPrecondition naming %s", err, c.name)
			}
			if !reflect.DeepEqual(s, baseSpec()) {
				t.Errorf("the refused adjustment changed the spec: %+v", s)
			}
		})
	}
}

// fakeCDI records the devices it is asked for.
type fakeCDI struct{ injected []string }

func (f *fakeCDI) Inject(_ *specs.Spec, devices []string) error {
	f.injected = append(f.injected, devices...)
	return nil
}

// anyLimits is a host that can set every limit.
type anyLimits struct{}

func (anyLimits) Unhonourable(*specs.LinuxResources) error { return nil }
