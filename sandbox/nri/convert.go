package nri

import (
	"maps"
	"slices"

	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/containerd/nri/pkg/api"
)

// PodOf is pod as plugins see it.
func PodOf(pod *store.Pod) *api.PodSandbox {
	md := pod.Config.GetMetadata()
	p := &api.PodSandbox{Id: pod.ID, Name: md.GetName(), Uid: md.GetUid(), Namespace: md.GetNamespace(),
		Labels: pod.Config.GetLabels(), Annotations: pod.Config.GetAnnotations(), Pid: uint32(pod.PausePID),
		Linux: &api.LinuxPodSandbox{CgroupParent: pod.Config.GetLinux().GetCgroupParent(), CgroupsPath: pod.Cgroup}}
	if pod.IP != "" {
		p.Ips = append([]string{pod.IP}, pod.AdditionalIPs...)
	}
	for _, kind := range slices.Sorted(maps.Keys(pod.Pins)) {
		p.Linux.Namespaces = append(p.Linux.Namespaces, &api.LinuxNamespace{Type: kind, Path: pod.Pins[kind]})
	}
	return p
}

// ContainerOf is c as plugins see it: from its spec where there is one,
// else from its CRI config.
func ContainerOf(c Container) *api.Container {
	cfg := c.Rec.Config
	ctr := &api.Container{Id: c.Rec.ID, PodSandboxId: c.Rec.PodID, Name: cfg.GetMetadata().GetName(), State: c.State,
		Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(), CreatedAt: c.Rec.CreatedAt.UnixNano(), Pid: uint32(c.Pid)}
	s := c.Spec
	if s == nil {
		ctr.Linux = &api.LinuxContainer{Resources: api.FromOCILinuxResources(c.Rec.Resources, nil)}
		return ctr
	}
	ctr.Annotations = s.Annotations
	if p := s.Process; p != nil {
		ctr.Args, ctr.Env = p.Args, p.Env
		for _, r := range p.Rlimits {
			ctr.Rlimits = append(ctr.Rlimits, &api.POSIXRlimit{Type: r.Type, Hard: r.Hard, Soft: r.Soft})
		}
	}
	ctr.Mounts, ctr.Hooks = api.FromOCIMounts(s.Mounts), api.FromOCIHooks(s.Hooks)
	if l := s.Linux; l != nil {
		ctr.Linux = &api.LinuxContainer{Namespaces: api.FromOCILinuxNamespaces(l.Namespaces), Devices: api.FromOCILinuxDevices(l.Devices),
			Resources: api.FromOCILinuxResources(l.Resources, nil), CgroupsPath: l.CgroupsPath, Sysctl: l.Sysctl}
		if s.Process != nil && s.Process.OOMScoreAdj != nil {
			ctr.Linux.OomScoreAdj = api.Int(*s.Process.OOMScoreAdj)
		}
	}
	return ctr
}
