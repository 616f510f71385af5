package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/cri/crashpoint"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/nri"
	"github.com/berth-runtime/berth/sandbox/rootfs"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/containerd/nri/pkg/api"
)

func (m *Manager) layout(c *store.Container, lowers []string) rootfs.Layout {
	return rootfs.Layout{
		Lowers: lowers,
		Upper:  filepath.Join(m.layerDir(c), "upper"),
		Work:   filepath.Join(m.layerDir(c), "work"),
		Target: filepath.Join(m.bundleDir(c.PodID, c.ID), "rootfs"),
	}
}

// discardInShim undoes a create in the shim: kill, wait, delete. A
// container the shim never made is not an error.
func (m *Manager) discardInShim(ctx context.Context, client *shim.Client, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shimCallTimeout)
	defer cancel()
	err := client.Kill(ctx, id, syscall.SIGKILL, true)
	if err == nil {
		_, err = waitStopped(ctx, client, id, 10*time.Second)
	}
	if err == nil || shim.IsNotFound(err) || errors.Is(err, shim.ErrNotRunning) {
		err = client.Delete(ctx, id)
	}
	if shim.IsNotFound(err) || errors.Is(err, shim.ErrUnavailable) {
		return nil
	}
	return err
}

// StartContainer starts a created container.
func (m *Manager) StartContainer(ctx context.Context, id string) error {
	c, unlock, err := m.lockContainer(id)
	if err != nil {
		return err
	}
	defer unlock()
	if c.CleanupFailed != "" {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s: its create failed (%s): remove it", c.ID, c.CleanupFailed)
	}
	if st := m.containerState(c); st.Status != shim.StatusCreated {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is %s, not created", c.ID, st.Status)
	}
	client, err := m.podShim(c.PodID)
	if err != nil {
		return err
	}
	pod, err := m.GetPod(c.PodID)
	if err != nil {
		return err
	}
	if err := m.opts.NRI.StartContainer(ctx, pod, m.nriContainer(c)); err != nil {
		return err
	}
	t := newTimeline(ctx)
	st, err := client.Start(ctx, c.ID)
	if err != nil {
		return startError(err)
	}
	m.setContainerState(c.PodID, st)
	m.opts.NRI.PostStartContainer(ctx, pod, m.nriContainer(c))
	crashpoint.Hit("start container", "started")
	t.step("start")
	m.metrics.ObserveTimeline("container", t.steps)
	// The start joins the create's phases in the timeline verbose status
	// shows; the container runs whatever this write does.
	c.Timeline = append(c.Timeline, t.steps...)
	if err := m.store.SaveContainer(c); err != nil {
		m.log.Warn("record container start phase", "container", c.ID, "err", err)
	}
	return nil
}

// StopContainer signals the container's stop signal, then SIGKILL once
// timeout has passed, and returns when it has exited. It is idempotent, as
// the CRI asks: an unknown container is OK.
func (m *Manager) StopContainer(ctx context.Context, id string, timeout time.Duration) error {
	c, unlock, err := m.lockContainer(id)
	if errors.Is(err, errkind.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()
	return m.stopContainerLocked(ctx, c, timeout)
}

func (m *Manager) stopContainerLocked(ctx context.Context, c *store.Container, timeout time.Duration) error {
	if m.containerState(c).Status == shim.StatusStopped {
		// It exited on its own: its exit event may still be telling.
		m.tellNRIStopped(c.PodID, c.ID)
		return nil
	}
	client, err := m.podShim(c.PodID)
	if err != nil {
		return err
	}
	if timeout > 0 {
		sig, _ := c.SignalInForce()
		if err := client.Kill(ctx, c.ID, sig, false); err != nil {
			return ignoreNeverMade(err)
		}
		crashpoint.Hit("stop container", "signalled")
		if exited, err := m.waitExit(ctx, client, c, timeout); err != nil || exited {
			if exited {
				m.tellNRIStopped(c.PodID, c.ID)
			}
			return err
		}
	}
	if err := client.Kill(ctx, c.ID, syscall.SIGKILL, true); err != nil {
		return ignoreNeverMade(err)
	}
	exited, err := m.waitExit(ctx, client, c, killGrace)
	if err == nil && !exited {
		// Stuck (frozen, or in the kernel): saying "stopped" would let the
		// kubelet go on as if it were gone.
		return errkind.Errorf(errkind.DeadlineExceeded, "container %s still runs %v after SIGKILL", c.ID, killGrace)
	}
	if err == nil {
		m.tellNRIStopped(c.PodID, c.ID)
	}
	return err
}

// ignoreNeverMade: a container the shim does not know, while its pod is
// locked, was recorded and never made in the shim (berthd died during its
// create). There is nothing to stop.
func ignoreNeverMade(err error) error {
	if shim.IsNotFound(err) {
		return nil
	}
	return err
}

// killGrace is how long a SIGKILLed container may take to be gone.
const killGrace = 10 * time.Second

// waitExit waits up to d for the container to exit, and records its exit
// (the shim's event may come after the reply).
func (m *Manager) waitExit(ctx context.Context, client *shim.Client, c *store.Container, d time.Duration) (bool, error) {
	st, err := waitStopped(ctx, client, c.ID, d)
	if err == nil && st.Status == shim.StatusStopped {
		m.setContainerState(c.PodID, st)
		return true, nil
	}
	return false, err
}

// waitStopped waits up to d for a process in the shim to stop; a timeout
// is no error, and the state returned is then not stopped.
func waitStopped(ctx context.Context, client *shim.Client, id string, d time.Duration) (shim.State, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	st, err := client.Wait(ctx, id)
	if errors.Is(err, context.DeadlineExceeded) {
		return shim.State{}, nil
	}
	return st, err
}

// RemoveContainer kills the container if it runs and removes it with its
// rootfs and writable layer. Removing an unknown container is not an error.
func (m *Manager) RemoveContainer(ctx context.Context, id string) error {
	c, unlock, err := m.lockContainer(id)
	if errors.Is(err, errkind.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()
	return m.removeContainerLocked(ctx, c)
}

func (m *Manager) removeContainerLocked(ctx context.Context, c *store.Container) error {
	if err := m.stopContainerLocked(ctx, c, 0); err != nil {
		return err
	}
	if client, err := m.podShim(c.PodID); err == nil {
		if err := client.Delete(ctx, c.ID); err != nil && !shim.IsNotFound(err) && !errors.Is(err, shim.ErrUnavailable) {
			return err
		}
		crashpoint.Hit("remove container", "deleted in shim")
	}
	if err := rootfs.Unmount(m.layout(c, nil)); err != nil {
		return err
	}
	if err := m.unmountImageVolumes(c.PodID, c.ID); err != nil {
		return err
	}
	crashpoint.Hit("remove container", "rootfs unmounted")
	if err := os.RemoveAll(m.layerDir(c)); err != nil {
		return err
	}
	if err := m.removeBundle(c.PodID, c.ID); err != nil {
		return err
	}
	crashpoint.Hit("remove container", "folders removed")
	m.stats.Forget(c.ID)
	m.metrics.Forget(c.ID)
	// Release first: a crash between the two leaves a record, which a retry
	// removes, never a lease nobody would release.
	if err := errors.Join(m.releaseImageVolumes(c), m.releaseCheckpoint(c), m.opts.Images.Release(c.ID)); err != nil {
		return err
	}
	crashpoint.Hit("remove container", "image released")
	if err := m.store.DeleteContainer(c.ID); err != nil {
		return err
	}
	if pod, err := m.GetPod(c.PodID); err == nil {
		m.opts.NRI.RemoveContainer(ctx, pod, nri.Container{Rec: c, State: api.ContainerState_CONTAINER_STOPPED})
	}
	m.nriStops.Delete(c.ID)
	m.store.Publish(store.EventContainerDeleted, c.PodID, c.ID)
	return nil
}

// lockContainer finds a container and locks its pod.
func (m *Manager) lockContainer(id string) (*store.Container, func(), error) {
	c, err := m.GetContainer(id)
	if err != nil {
		return nil, nil, err
	}
	unlock := m.pods.lock(c.PodID)
	if c, err = m.GetContainer(c.ID); err != nil { // removed while we waited
		unlock()
		return nil, nil, err
	}
	return c, unlock, nil
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
