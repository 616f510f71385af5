package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Version changes with every change of a pod or container: cri keeps its
// node-wide lists until it does (see store.Store.Version).
func (m *Manager) Version() uint64 { return m.store.Version() }

// Subscribe starts a subscription to every pod and container event.
func (m *Manager) Subscribe() *store.Subscription { return m.store.Subscribe() }

// GetContainer returns the container whose ID is id or starts with id.
func (m *Manager) GetContainer(id string) (*store.Container, error) {
	c, _, err := m.store.Container(id)
	return c, err
}

// ListContainers returns the containers f selects with their live state.
// They are shared with every other caller, and read-only.
func (m *Manager) ListContainers(_ context.Context, f store.Filter) ([]*store.ContainerStatus, error) {
	return m.store.ListStatuses(f)
}

// ContainerStatus returns one container's live state and its OCI spec.
func (m *Manager) ContainerStatus(ctx context.Context, id string) (*store.ContainerStatus, error) {
	st, err := m.store.Status(id)
	if err != nil {
		return nil, err
	}
	spec, err := m.readSpec(st.Container)
	if err != nil {
		return nil, err
	}
	st.Spec = spec
	if st.User == nil && spec.Process != nil { // a record from before berth kept it
		st.User = &spec.Process.User
	}
	return st, nil
}

func (m *Manager) readSpec(c *store.Container) (*specs.Spec, error) {
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

// containerState is the container's live state as the store has it.
func (m *Manager) containerState(c *store.Container) shim.State {
	_, st, err := m.store.Container(c.ID)
	if err != nil { // removed meanwhile
		return shim.State{ID: c.ID, Status: shim.StatusStopped, ExitCode: shim.UnknownExitCode}
	}
	return st
}

// setContainerState records a container's state, as its shim reported it,
// and tells subscribers when its status changed.
func (m *Manager) setContainerState(podID string, st shim.State) {
	if !m.store.SetState(st) {
		return
	}
	switch st.Status {
	case shim.StatusRunning:
		m.store.Publish(store.EventContainerStarted, podID, st.ID)
	case shim.StatusStopped:
		if st.OOMKilled {
			m.metrics.SawOOM(st.ID)
		}
		m.store.Publish(store.EventContainerStopped, podID, st.ID)
		m.tellNRIStopped(podID, st.ID)
	}
}

// loadRecordedStates sets the state of the pod's containers that its shim
// does not tell (told are those it told) from their records. When the
// shim is gone (or deleted them) none runs any more: one without an exit
// record is stopped, exit code unknown. A wedged shim's are as their
// records say, until it answers.
func (m *Manager) loadRecordedStates(podID string, told map[string]bool, gone bool) {
	states := m.store.StatesOf(podID)
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
