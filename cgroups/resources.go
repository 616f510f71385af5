package cgroups

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/cgroups"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// SharesToWeight converts v1 cpu.shares to v2 cpu.weight (0 stays 0, unset).
// It is the conversion runc applies to a container's OCI cpu shares
// (opencontainers/cgroups, the one Kubernetes moved to: 2→1, 1024→100,
// 262144→10000), so a pod cgroup and the containers in it get weights on
// the same scale.
func SharesToWeight(shares uint64) uint64 {
	return cgroups.ConvertCPUSharesToCgroupV2Value(shares)
}

// SpecResources maps CRI resources to the OCI resources runc applies to a
// container's cgroup. pidsLimit is separate because CRI has no such field
// (0 = unset, -1 = unlimited). Fields the host cannot honour at all are left
// out rather than failing every container, as containerd does: the swap limit
// without swap accounting (the kubelet always sends one), hugepage limits
// without the hugetlb controller.
func SpecResources(res *runtimeapi.LinuxContainerResources, mode Mode, pidsLimit int64) (*specs.LinuxResources, error) {
	return specResources(res, mode, pidsLimit, defaultCaps())
}

func specResources(res *runtimeapi.LinuxContainerResources, mode Mode, pidsLimit int64, caps hostCaps) (*specs.LinuxResources, error) {
	if mode != V1 && mode != V2 {
		return nil, fmt.Errorf("unknown cgroup mode %v", mode)
	}
	out := &specs.LinuxResources{}
	if pidsLimit < -1 {
		return nil, fmt.Errorf("pids limit: %d is not -1 (unlimited), 0 (unset) or positive", pidsLimit)
	}
	if pidsLimit != 0 {
		out.Pids = &specs.LinuxPids{Limit: &pidsLimit}
	}
	if res == nil {
		return out, nil
	}

	cpu, err := specCPU(res)
	if err != nil {
		return nil, err
	}
	if *cpu != (specs.LinuxCPU{}) {
		out.CPU = cpu
	}

	mem, swap := res.MemoryLimitInBytes, res.MemorySwapLimitInBytes
	switch {
	case mem < 0:
		return nil, fmt.Errorf("memory_limit_in_bytes: %d is negative", mem)
	case swap < 0:
		return nil, fmt.Errorf("memory_swap_limit_in_bytes: %d is negative", swap)
	case swap > 0 && mem == 0:
		return nil, errors.New("memory_swap_limit_in_bytes is set without memory_limit_in_bytes")
	case swap > 0 && swap < mem:
		return nil, fmt.Errorf("memory_swap_limit_in_bytes: %d is below memory_limit_in_bytes %d (it is memory+swap)", swap, mem)
	}
	if mem > 0 {
		out.Memory = &specs.LinuxMemory{Limit: &mem}
		if swap > 0 && caps.swap {
			out.Memory.Swap = &swap
		}
	}

	for i, h := range res.HugepageLimits {
		if !pageSizeRE.MatchString(h.GetPageSize()) {
			return nil, fmt.Errorf("hugepage_limits[%d].page_size: %q is not like 2MB or 1GB", i, h.GetPageSize())
		}
		if caps.hugetlb {
			out.HugepageLimits = append(out.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: h.GetPageSize(), Limit: h.GetLimit()})
		}
	}

	if err := unifiedInMode(res.Unified, mode); err != nil {
		return nil, err
	}
	if len(res.Unified) > 0 {
		for _, k := range slices.Sorted(maps.Keys(res.Unified)) {
			ctrl, param, ok := strings.Cut(k, ".")
			if !ok || ctrl == "" || param == "" || strings.Contains(k, "/") {
				return nil, fmt.Errorf("unified[%q]: not a cgroup file name like memory.high", k)
			}
		}
		out.Unified = maps.Clone(res.Unified)
	}
	return out, nil
}

// unifiedInMode refuses unified keys in v1 mode, naming the first.
func unifiedInMode(unified map[string]string, mode Mode) error {
	if len(unified) > 0 && mode == V1 {
		return fmt.Errorf("unified[%q]: unified keys need cgroup v2 and this host is in v1 mode", slices.Sorted(maps.Keys(unified))[0])
	}
	return nil
}

// Unhonourable names the first limit of r, resources in the spec's form
// that come from elsewhere than the CRI (NRI plugins), that this host
// cannot set at all: cgroup v2 unified keys in v1 mode, hugepage limits
// without the hugetlb controller. runc fails a container on either
// without naming it; the CRI's own are checked (or, for hugepages, left
// out) by SpecResources.
func (m *Manager) Unhonourable(r *specs.LinuxResources) error {
	if r == nil {
		return nil
	}
	if err := unifiedInMode(r.Unified, m.mode); err != nil {
		return err
	}
	if len(r.HugepageLimits) > 0 && !m.caps.hugetlb {
		return fmt.Errorf("hugepage_limits[%q]: the host has no hugetlb controller", r.HugepageLimits[0].Pagesize)
	}
	return nil
}

var pageSizeRE = regexp.MustCompile(`^[1-9][0-9]*[KMGTP]B$`)

func specCPU(res *runtimeapi.LinuxContainerResources) (*specs.LinuxCPU, error) {
	cpu := &specs.LinuxCPU{}
	if s := res.CpuShares; s < 0 {
		return nil, fmt.Errorf("cpu_shares: %d is negative", s)
	} else if s > 0 {
		u := uint64(s)
		cpu.Shares = &u
	}
	// The kernel takes periods of 1ms..1s and quotas of at least 1ms.
	period, quota := res.CpuPeriod, res.CpuQuota
	if period != 0 && (period < 1000 || period > 1000000) {
		return nil, fmt.Errorf("cpu_period: %dµs is outside 1000..1000000", period)
	}
	switch {
	case quota == 0:
	case quota < -1:
		return nil, fmt.Errorf("cpu_quota: %d is neither -1 (unlimited) nor positive", quota)
	case quota > 0 && quota < 1000:
		return nil, fmt.Errorf("cpu_quota: %dµs is below the kernel's minimum of 1000", quota)
	case quota > 0 && period == 0:
		return nil, fmt.Errorf("cpu_quota %d is set without cpu_period", quota)
	default:
		cpu.Quota = &quota
	}
	if period > 0 {
		p := uint64(period)
		cpu.Period = &p
	}
	if !validList(res.CpusetCpus) {
		return nil, fmt.Errorf("cpuset_cpus: %q is not a list like 0-3,6", res.CpusetCpus)
	}
	if !validList(res.CpusetMems) {
		return nil, fmt.Errorf("cpuset_mems: %q is not a list like 0-1", res.CpusetMems)
	}
	cpu.Cpus, cpu.Mems = res.CpusetCpus, res.CpusetMems
	return cpu, nil
}

// validList checks the kernel's cpuset list format ("0-3,6,8-9"); "" is unset.
func validList(s string) bool {
	if s == "" {
		return true
	}
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return false
		}
		if isRange {
			b, err := strconv.ParseUint(hi, 10, 16)
			if err != nil || b < a {
				return false
			}
		}
	}
	return true
}

// libResources converts OCI resources into what the opencontainers/cgroups
// managers apply, as runc's specconv does for containers.
func libResources(s *specs.LinuxResources, mode Mode) *cgroups.Resources {
	// Pod cgroups leave device rules alone, as the kubelet's do; each
	// container's device cgroup is set by runc.
	r := &cgroups.Resources{SkipDevices: true}
	if c := s.CPU; c != nil {
		if c.Shares != nil {
			r.CpuShares = *c.Shares
			if mode == V2 {
				r.CpuWeight = SharesToWeight(*c.Shares)
			}
		}
		if c.Quota != nil {
			r.CpuQuota = *c.Quota
		}
		if c.Period != nil {
			r.CpuPeriod = *c.Period
		}
		r.CpusetCpus, r.CpusetMems = c.Cpus, c.Mems
	}
	if m := s.Memory; m != nil {
		if m.Limit != nil {
			r.Memory = *m.Limit
		}
		if m.Swap != nil {
			r.MemorySwap = *m.Swap
		}
	}
	if s.Pids != nil {
		r.PidsLimit = s.Pids.Limit
	}
	for _, h := range s.HugepageLimits {
		r.HugetlbLimit = append(r.HugetlbLimit, &cgroups.HugepageLimit{Pagesize: h.Pagesize, Limit: h.Limit})
	}
	if mode == V2 && len(s.Unified) > 0 {
		r.Unified = maps.Clone(s.Unified)
	}
	return r
}
