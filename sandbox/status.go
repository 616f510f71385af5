package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-runtime/berth/sandbox/shim"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	bolt "go.etcd.io/bbolt"
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
	Reason     string // Completed, Error, OOMKilled
	Message    string
	User       specs.User
	Spec       *specs.Spec // only from ContainerStatus
}

// GetContainer returns the container whose ID is id or starts with id.
func (m *Manager) GetContainer(id string) (*Container, error) {
	var c *Container
	err := m.view(func(tx *bolt.Tx) (err error) {
		c, err = findContainer(tx, id)
		return err
	})
	return c, err
}

// ListContainers returns the containers f selects with their live state.
func (m *Manager) ListContainers(ctx context.Context, f Filter) ([]*ContainerStatus, error) {
	found, err := resolve(&f.ID, m.containerID)
	if found {
		found, err = resolve(&f.PodID, m.podID)
	}
	if !found {
		return nil, err
	}
	ctrs, err := m.listContainers(f.PodID)
	if err != nil {
		return nil, err
	}
	out := make([]*ContainerStatus, 0, len(ctrs))
	for _, c := range ctrs {
		if f.ID != "" && c.ID != f.ID || !labelsMatch(c.Config.Labels, f.Labels) {
			continue
		}
		st, err := m.status(ctx, c)
		if errors.Is(err, ErrNotFound) {
			continue // removed since it was listed
		}
		if err != nil {
			return nil, err
		}
		if f.matches(st.ID, st.Config.Labels, int32(st.State)) {
			out = append(out, st)
		}
	}
	return out, nil
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
	c, err := m.GetContainer(id)
	if err != nil {
		return nil, err
	}
	st, err := m.status(ctx, c)
	if err != nil {
		return nil, err
	}
	spec, err := m.readSpec(c)
	if err != nil {
		return nil, err
	}
	st.Spec = spec
	if spec.Process != nil {
		st.User = spec.Process.User
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

func (m *Manager) listContainers(podID string) ([]*Container, error) {
	var out []*Container
	err := m.view(func(tx *bolt.Tx) error {
		return tx.Bucket(containersBucket).ForEach(func(_, v []byte) error {
			c, err := decodeContainer(v)
			if err == nil && (podID == "" || c.PodID == podID) {
				out = append(out, c)
			}
			return err
		})
	})
	return out, err
}

func (m *Manager) status(ctx context.Context, c *Container) (*ContainerStatus, error) {
	st, err := m.containerState(ctx, c)
	if err != nil {
		return nil, err
	}
	cs := &ContainerStatus{Container: c, Pid: st.Pid, StartedAt: st.StartedAt, FinishedAt: st.FinishedAt, ExitCode: int32(st.ExitCode)}
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
			m.metrics.sawOOM(c.ID)
		case st.ExitCode == 0:
			cs.Reason = "Completed"
		default:
			cs.Reason = "Error"
		}
	default:
		cs.State = runtimeapi.ContainerState_CONTAINER_UNKNOWN
	}
	return cs, nil
}

// containerState asks the pod's shim; when the shim is gone (stopped pod,
// killed shim, reboot) the container is reported as exited with what its
// exit record holds.
func (m *Manager) containerState(ctx context.Context, c *Container) (shim.State, error) {
	shimAnswered := false
	client, err := m.podShim(c.PodID)
	if err == nil {
		st, err := client.State(ctx, c.ID)
		switch {
		case err == nil:
			return st, nil
		case errors.Is(err, shim.ErrUnavailable):
			m.forgetShim(c.PodID)
		case !shim.IsNotFound(err): // not found: deleted from the shim at pod stop
			return st, fmt.Errorf("container %s: %w", c.ID, err)
		default:
			shimAnswered = true
		}
	}
	st, err := shim.ReadRecordedState(m.bundleDir(c.PodID, c.ID))
	if !shim.IsNotFound(err) {
		return st, err
	}
	// Nothing recorded at all: the container was removed since the caller
	// read its record, or it is still being created (its record comes
	// first), or its folder went with the state folder in a reboot.
	if _, err := m.GetContainer(c.ID); err != nil {
		return shim.State{}, err // ErrNotFound when removed
	}
	if shimAnswered {
		return shim.State{ID: c.ID, Status: shim.StatusCreated}, nil
	}
	return shim.State{ID: c.ID, Status: shim.StatusStopped, ExitCode: shim.UnknownExitCode}, nil
}
