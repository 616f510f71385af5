package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
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

// GetContainer returns the container whose ID is id or starts with id.
func (m *Manager) GetContainer(id string) (*Container, error) {
	c, _, err := m.state.container(id)
	return c, err
}

// ListContainers returns the containers f selects with their live state.
// They are shared with every other caller, and read-only.
func (m *Manager) ListContainers(_ context.Context, f Filter) ([]*ContainerStatus, error) {
	found, err := resolve(&f.ID, m.containerID)
	if found {
		found, err = resolve(&f.PodID, m.podID)
	}
	if !found {
		return nil, err
	}
	return m.state.listStatuses(f), nil
}

func (m *Manager) containerID(prefix string) (string, error) {
	c, err := m.GetContainer(prefix)
	if err != nil {
		return "", err
	}
	return c.ID, nil
}

// ContainerStatus returns one container's live state and its OCI spec.
func (m *Manager) ContainerStatus(ctx context.Context, id string) (*ContainerStatus, error) {
	c, state, err := m.state.container(id)
	if err != nil {
		return nil, err
	}
	st := statusOf(c, state)
	spec, err := m.readSpec(c)
	if err != nil {
		return nil, err
	}
	st.Spec = spec
	if st.User == nil && spec.Process != nil { // a record from before berth kept it
		st.User = &spec.Process.User
	}
	return st, nil
}

func (m *Manager) readSpec(c *Container) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(m.bundleDir(c.PodID, c.ID), "config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return &specs.Spec{}, nil // volatile state lost in a reboot
	}
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	return &s, json.Unmarshal(b, &s)
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

// containerState is the container's live state as the view has it.
func (m *Manager) containerState(c *Container) shim.State {
	_, st, err := m.state.container(c.ID)
	if err != nil { // removed meanwhile
		return shim.State{ID: c.ID, Status: shim.StatusStopped, ExitCode: shim.UnknownExitCode}
	}
	return st
}

// setContainerState records a container's state, as its shim reported it,
// and tells subscribers when its status changed.
func (m *Manager) setContainerState(podID string, st shim.State) {
	if !m.state.setState(st) {
		return
	}
	switch st.Status {
	case shim.StatusRunning:
		m.publish(EventContainerStarted, podID, st.ID)
	case shim.StatusStopped:
		if st.OOMKilled {
			m.metrics.sawOOM(st.ID)
		}
		m.publish(EventContainerStopped, podID, st.ID)
	}
}

// loadRecordedStates sets the state of the pod's containers that its shim
// does not tell (told are those it told) from their records. When the
// shim is gone (or deleted them) none runs any more: one without an exit
// record is stopped, exit code unknown. A wedged shim's are as their
// records say, until it answers.
func (m *Manager) loadRecordedStates(podID string, told map[string]bool, gone bool) {
	_, states := m.state.listContainers(podID)
	for _, st := range states {
		if st.Status == shim.StatusStopped || told[st.ID] {
			continue
		}
		started, exited, err := shim.ReadRecords(m.bundleDir(podID, st.ID))
		if err != nil {
			m.log.Warn("container records unreadable", "container", st.ID, "err", err)
		}
		rec := shim.StateFromRecords(st.ID, started, exited)
		if gone && rec.Status != shim.StatusStopped {
			rec.Status, rec.ExitCode = shim.StatusStopped, shim.UnknownExitCode
		}
		m.setContainerState(podID, rec)
	}
}
