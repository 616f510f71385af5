package store

import (
	"sync/atomic"
	"time"

	"github.com/berth-runtime/berth/sandbox/shim"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerStatus is a container's record with its live state.
type ContainerStatus struct {
	*Container
	State      runtimeapi.ContainerState
	Pid        int
	StartedAt  time.Time
	FinishedAt time.Time
	ExitCode   int32
	Reason     string      // Completed, Error, OOMKilled
	Message    string      // the reason in words, where berth knows more than the exit code
	Spec       *specs.Spec // only from ContainerStatus
	// Memo is new with each status: the view makes one each time the
	// container's record or state changes, and lists share it until then,
	// so what a caller makes of it and keeps there (cri: the container's
	// list entry) serves every list until the container changes.
	Memo *Memo
}

// AppliedResources are the limits in force in CRI form, made from the
// record's when asked (appliedResources): only a container's own status
// and its pod's show them, not the lists the view rebuilds at each change.
// Nil when the record has none.
func (s *ContainerStatus) AppliedResources() *runtimeapi.LinuxContainerResources {
	return appliedResources(s.Container)
}

// appliedResources are the CRI resources c's record says are in force:
// the inverse of cgroups.SpecResources, so what the host could not honour
// (swap, hugetlb without their controllers) is not shown as applied. The
// OOM score is the config's, as the spec's process has it.
func appliedResources(c *Container) *runtimeapi.LinuxContainerResources {
	r := c.Resources
	if r == nil {
		return nil
	}
	out := &runtimeapi.LinuxContainerResources{Unified: r.Unified, OomScoreAdj: c.Config.GetLinux().GetResources().GetOomScoreAdj()}
	if c := r.CPU; c != nil {
		out.CpuPeriod, out.CpuQuota, out.CpuShares = int64(deref(c.Period)), deref(c.Quota), int64(deref(c.Shares))
		out.CpusetCpus, out.CpusetMems = c.Cpus, c.Mems
	}
	if m := r.Memory; m != nil {
		out.MemoryLimitInBytes, out.MemorySwapLimitInBytes = deref(m.Limit), deref(m.Swap)
	}
	for _, h := range r.HugepageLimits {
		out.HugepageLimits = append(out.HugepageLimits, &runtimeapi.HugepageLimit{PageSize: h.Pagesize, Limit: h.Limit})
	}
	return out
}

// deref is *p, or 0 for nil.
func deref[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}

// statusOf is a container's status from its live state.
func statusOf(c *Container, st shim.State) *ContainerStatus {
	cs := &ContainerStatus{Container: c, Pid: st.Pid, StartedAt: st.StartedAt, FinishedAt: st.FinishedAt, ExitCode: int32(st.ExitCode),
		Memo: &Memo{}}
	if c.CleanupFailed != "" {
		// Whatever the shim says of it (it may still hold it, created):
		// the create failed, and the kubelet removes an exited container.
		cs.State, cs.Reason = runtimeapi.ContainerState_CONTAINER_EXITED, "Error"
		cs.ExitCode = shim.UnknownExitCode
		cs.Message = "CreateContainer failed and its rollback did not finish (" + c.CleanupFailed + "): RemoveContainer finishes it"
		return cs
	}
	switch st.Status {
	case shim.StatusCreated:
		cs.State = runtimeapi.ContainerState_CONTAINER_CREATED
	case shim.StatusRunning:
		cs.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	case shim.StatusStopped:
		cs.State = runtimeapi.ContainerState_CONTAINER_EXITED
		switch {
		case st.OOMKilled:
			cs.Reason = "OOMKilled"
			cs.Message = "the kernel's out-of-memory killer killed a process of the container: memory ran out under its limit, its pod's or the host's"
		case st.ExitCode == shim.UnknownExitCode && st.FinishedAt.IsZero():
			cs.Reason = "Error"
			cs.Message = "the container's exit was not seen (its shim went away or the host restarted), so its exit code is unknown"
		case st.ExitCode == 0:
			cs.Reason = "Completed"
		default:
			cs.Reason = "Error"
		}
	default:
		cs.State = runtimeapi.ContainerState_CONTAINER_UNKNOWN
	}
	return cs
}

// Memo holds what a caller made of a value that does not change (a sample
// of the stats collector, a container's status), for the next callers.
type Memo struct{ v atomic.Value }

// Load returns what Store kept, nil before.
func (m *Memo) Load() any { return m.v.Load() }

// Store keeps v, always of the same type, for the next calls.
func (m *Memo) Store(v any) { m.v.Store(v) }
