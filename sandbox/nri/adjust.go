package nri

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

// CDI applies CDI devices' edits to a spec: berth's CDI registry.
type CDI interface {
	Inject(s *specs.Spec, devices []string) error
}

// Cgroups says which limits the host cannot set: berth's cgroup manager.
type Cgroups interface {
	Unhonourable(r *specs.LinuxResources) error
}

// Adjust makes the plugins' adjustment of a container's spec, with the CDI
// devices they name from cdi, or refuses it, naming the first change berth
// (or the host, as cg says) cannot make: none is dropped. On an error s
// may be partly changed: the caller drops it.
func Adjust(s *specs.Spec, a *api.ContainerAdjustment, cdi CDI, cg Cgroups) error {
	if a == nil {
		return nil
	}
	if err := refuseUnsupported(a); err != nil {
		return err
	}
	if err := refuseUnhonourable(cg, "adjustment", a.GetLinux().GetResources().ToOCI()); err != nil {
		return err
	}
	if err := checkMounts(a.Mounts); err != nil {
		return err
	}
	if err := checkAnnotations(a.Annotations); err != nil {
		return err
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	adjustAnnotations(s, a.Annotations)
	adjustEnv(s.Process, a.Env)
	if len(a.Args) > 0 {
		s.Process.Args = slices.Clone(a.Args)
	}
	adjustMounts(s, a.Mounts)
	adjustHooks(s, a.Hooks)
	adjustRlimits(s.Process, a.Rlimits)
	l := a.GetLinux()
	adjustDevices(s.Linux, l.GetDevices())
	if r := l.GetResources(); r != nil {
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		MergeResources(s.Linux.Resources, r.ToOCI())
	}
	if o := l.GetOomScoreAdj(); o != nil {
		v := int(o.Value)
		s.Process.OOMScoreAdj = &v
	}
	if p := l.GetIoPriority(); p != nil {
		s.Process.IOPriority = p.ToOCI()
	}
	return injectCDI(s, a.CDIDevices, cdi)
}

// injectCDI applies the edits of the CDI devices plugins named; one that
// no spec defines is refused by the registry, naming it.
func injectCDI(s *specs.Spec, devices []*api.CDIDevice, cdi CDI) error {
	if len(devices) == 0 {
		return nil
	}
	names := make([]string, len(devices))
	for i, d := range devices {
		names[i] = d.Name
	}
	if err := cdi.Inject(s, names); err != nil {
		return fmt.Errorf("NRI adjustment CDI_devices: %w", err)
	}
	return nil
}

// refuseUnsupported names the first adjustment berth does not make: each
// would change what berth owns (the cgroup, namespaces, seccomp) or needs
// what it does not have (RDT, block I/O classes, network devices).
func refuseUnsupported(a *api.ContainerAdjustment) error {
	l := a.GetLinux()
	r := l.GetResources()
	for _, u := range []struct {
		name string
		set  bool
	}{
		{"linux.cgroups_path", l.GetCgroupsPath() != ""},
		{"linux.namespaces", len(l.GetNamespaces()) > 0},
		{"linux.seccomp_policy", proto.Size(l.GetSeccompPolicy()) > 0},
		{"linux.sysctl", len(l.GetSysctl()) > 0},
		{"linux.net_devices", len(l.GetNetDevices()) > 0},
		{"linux.scheduler", proto.Size(l.GetScheduler()) > 0},
		// The library makes an empty one of each plugin's adjustment.
		{"linux.rdt", proto.Size(l.GetRdt()) > 0},
		{"linux.memory_policy", proto.Size(l.GetMemoryPolicy()) > 0},
		{"linux.resources.blockio_class", r.GetBlockioClass() != nil},
		{"linux.resources.rdt_class", r.GetRdtClass() != nil},
		// Obsolete since Linux 5.4, and not in cgroup v2.
		{"linux.resources.memory.kernel", r.GetMemory().GetKernel() != nil},
	} {
		if u.set {
			return errkind.Errorf(errkind.FailedPrecondition, "NRI adjustment %s: berth does not support it", u.name)
		}
	}
	return nil
}

// refuseUnhonourable refuses a plugin's resources (of an adjustment or an
// update, as what says) that the host cannot set, naming the first.
func refuseUnhonourable(cg Cgroups, what string, r *specs.LinuxResources) error {
	if err := cg.Unhonourable(r); err != nil {
		return errkind.Errorf(errkind.FailedPrecondition, "NRI %s linux.resources.%v", what, err)
	}
	return nil
}

// checkMounts refuses mounts that propagate to or from the host: their
// source would need a shared mount berth does not set up.
func checkMounts(mounts []*api.Mount) error {
	for _, m := range mounts {
		for _, o := range m.Options {
			if strings.Contains(o, "shared") || strings.Contains(o, "slave") {
				return errkind.Errorf(errkind.FailedPrecondition, "NRI adjustment mounts[%s]: propagation %q: berth does not support it", m.Destination, o)
			}
		}
	}
	return nil
}

// checkAnnotations refuses a change to an annotation only berth sets (its
// CRIU configuration), as a pod's own would be: the shim would refuse the
// container's checkpoints later for it.
func checkAnnotations(annotations map[string]string) error {
	for k := range annotations {
		key, _ := api.IsMarkedForRemoval(k)
		if err := spec.CheckReservedAnnotations("NRI adjustment annotations", map[string]string{key: ""}); err != nil {
			return errkind.Errorf(errkind.FailedPrecondition, "%v", err)
		}
	}
	return nil
}

func adjustAnnotations(s *specs.Spec, annotations map[string]string) {
	for k, v := range annotations {
		if key, remove := api.IsMarkedForRemoval(k); remove {
			delete(s.Annotations, key)
			continue
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func adjustEnv(p *specs.Process, env []*api.KeyValue) {
	for _, e := range env {
		key, remove := e.IsMarkedForRemoval()
		p.Env = slices.DeleteFunc(p.Env, func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
		if !remove {
			p.Env = append(p.Env, e.Key+"="+e.Value)
		}
	}
}

// adjustMounts replaces the mount at each destination a plugin names, or
// adds it after the others.
func adjustMounts(s *specs.Spec, mounts []*api.Mount) {
	for _, m := range mounts {
		dest, remove := m.IsMarkedForRemoval()
		s.Mounts = slices.DeleteFunc(s.Mounts, func(o specs.Mount) bool { return o.Destination == dest })
		if !remove {
			s.Mounts = append(s.Mounts, m.ToOCI(nil))
		}
	}
}

func adjustHooks(s *specs.Spec, h *api.Hooks) {
	if h == nil {
		return
	}
	if s.Hooks == nil {
		s.Hooks = &specs.Hooks{}
	}
	for _, p := range []struct {
		to   *[]specs.Hook
		from []*api.Hook
	}{
		//lint:ignore SA1019 the protocol still has plugins add prestart hooks, which runc runs
		{&s.Hooks.Prestart, h.Prestart},
		{&s.Hooks.CreateRuntime, h.CreateRuntime},
		{&s.Hooks.CreateContainer, h.CreateContainer}, {&s.Hooks.StartContainer, h.StartContainer},
		{&s.Hooks.Poststart, h.Poststart}, {&s.Hooks.Poststop, h.Poststop},
	} {
		for _, hook := range p.from {
			*p.to = append(*p.to, hook.ToOCI())
		}
	}
}

func adjustRlimits(p *specs.Process, rlimits []*api.POSIXRlimit) {
	for _, r := range rlimits {
		p.Rlimits = slices.DeleteFunc(p.Rlimits, func(o specs.POSIXRlimit) bool { return o.Type == r.Type })
		p.Rlimits = append(p.Rlimits, specs.POSIXRlimit{Type: r.Type, Hard: r.Hard, Soft: r.Soft})
	}
}

// adjustDevices adds (or replaces by path) device nodes, each with the
// device cgroup rule that lets the container use it.
func adjustDevices(l *specs.Linux, devices []*api.LinuxDevice) {
	for _, d := range devices {
		path, remove := d.IsMarkedForRemoval()
		l.Devices = slices.DeleteFunc(l.Devices, func(o specs.LinuxDevice) bool { return o.Path == path })
		if remove {
			continue
		}
		l.Devices = append(l.Devices, d.ToOCI())
		if l.Resources == nil {
			l.Resources = &specs.LinuxResources{}
		}
		major, minor := d.Major, d.Minor
		l.Resources.Devices = append(l.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: d.Type,
			Major: &major, Minor: &minor, Access: d.AccessString()})
	}
}

// MergeResources sets in to each limit from has: what a plugin left
// unset stays as it was.
func MergeResources(to, from *specs.LinuxResources) {
	if from == nil {
		return
	}
	if c := from.CPU; c != nil && *c != (specs.LinuxCPU{}) {
		if to.CPU == nil {
			to.CPU = &specs.LinuxCPU{}
		}
		mergeCPU(to.CPU, c)
	}
	if m := from.Memory; m != nil && *m != (specs.LinuxMemory{}) {
		if to.Memory == nil {
			to.Memory = &specs.LinuxMemory{}
		}
		mergeMemory(to.Memory, m)
	}
	for _, h := range from.HugepageLimits {
		to.HugepageLimits = slices.DeleteFunc(to.HugepageLimits, func(o specs.LinuxHugepageLimit) bool { return o.Pagesize == h.Pagesize })
		to.HugepageLimits = append(to.HugepageLimits, h)
	}
	if len(from.Unified) > 0 {
		if to.Unified == nil {
			to.Unified = map[string]string{}
		}
		maps.Copy(to.Unified, from.Unified)
	}
	if from.Pids != nil && from.Pids.Limit != nil {
		to.Pids = from.Pids
	}
	to.Devices = append(to.Devices, from.Devices...)
}

func mergeCPU(to, from *specs.LinuxCPU) {
	setIf(&to.Shares, from.Shares)
	setIf(&to.Quota, from.Quota)
	setIf(&to.Period, from.Period)
	setIf(&to.RealtimeRuntime, from.RealtimeRuntime)
	setIf(&to.RealtimePeriod, from.RealtimePeriod)
	if from.Cpus != "" {
		to.Cpus = from.Cpus
	}
	if from.Mems != "" {
		to.Mems = from.Mems
	}
}

func mergeMemory(to, from *specs.LinuxMemory) {
	setIf(&to.Limit, from.Limit)
	setIf(&to.Reservation, from.Reservation)
	setIf(&to.Swap, from.Swap)
	setIf(&to.KernelTCP, from.KernelTCP)
	setIf(&to.Swappiness, from.Swappiness)
	setIf(&to.DisableOOMKiller, from.DisableOOMKiller)
	setIf(&to.UseHierarchy, from.UseHierarchy)
}

func setIf[T any](to **T, from *T) {
	if from != nil {
		*to = from
	}
}
