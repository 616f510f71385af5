package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// shimCallTimeout bounds calls that must not hang on a wedged shim.
const shimCallTimeout = 30 * time.Second

// shim returns the cached client of a pod's shim, or nil.
func (m *Manager) shim(podID string) *shim.Client {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shims[podID]
}

// startShimAsync starts the shim of the pod folder dir in the background;
// the function it returns waits for the outcome (the same on every call).
func (m *Manager) startShimAsync(ctx context.Context, dir string) func() (*shim.Client, error) {
	type outcome struct {
		c   *shim.Client
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		c, err := m.opts.StartShim(ctx, dir)
		done <- outcome{c, err}
	}()
	return sync.OnceValues(func() (*shim.Client, error) {
		o := <-done
		return o.c, o.err
	})
}

func (m *Manager) setShim(podID string, c *shim.Client) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.shims[podID]
	if old == c {
		return // already the pod's, and followed
	}
	if old != nil {
		old.Close()
	}
	m.shims[podID] = c
	go m.followShim(podID, c)
}

// followShim keeps one Events call parked on the shim and applies what it
// pushes to the store, until the shim goes away. When it goes while berthd
// still counts on it (no stop or replacement meanwhile), the pod is made
// NOTREADY at once, so that the kubelet recreates it, instead of at
// berthd's next start.
func (m *Manager) followShim(podID string, c *shim.Client) {
	var after uint64
	for {
		r, err := c.Events(context.Background(), after)
		if errors.Is(err, shim.ErrNoEvents) {
			m.pollShim(podID, c)
			break
		}
		if err != nil && !errors.Is(err, shim.ErrUnavailable) {
			m.log.Error("pod shim events", "pod", podID, "err", err)
		}
		if err != nil || r.Quit {
			break
		}
		after = r.Seq
		for _, e := range r.Events {
			m.applyShimEvent(podID, c, e)
		}
	}
	unlock := m.pods.lock(podID) // a stop in progress finishes first
	defer unlock()
	if m.shim(podID) != c {
		return // berthd stopped or replaced it
	}
	m.forgetShim(podID)
	pod, err := m.GetPod(podID)
	if err != nil || pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return
	}
	m.log.Warn("pod shim exited: pod is not ready", "pod", podID)
	if err := m.shimLost(pod); err != nil {
		m.log.Error("clean up after a lost shim", "pod", podID, "err", err)
	}
}

// shimLost makes a pod whose shim is gone NOTREADY: what still runs of its
// containers and pause is killed (their exit records say EXITED: make it
// so), and its namespace pins are released.
func (m *Manager) shimLost(pod *store.Pod) error {
	ctrs := m.store.ContainersOf(pod.ID)
	if err := m.killLeftovers(pod, ctrs); err != nil {
		return err
	}
	m.loadRecordedStates(pod.ID, nil, true)
	if err := podns.Remove(m.nsDir(pod.ID)); err != nil {
		return err
	}
	return m.podNotReady(pod)
}

// legacyPollPeriod is how often berthd asks a shim from before Events
// for the state of its pod's containers.
const legacyPollPeriod = time.Second

// pollShim follows a shim from before Events (one that outlived an
// upgrade of berth, until its pod is recreated): every legacyPollPeriod
// it asks the state of the pod's live containers and pause, until the
// shim is gone.
func (m *Manager) pollShim(podID string, c *shim.Client) {
	tick := time.NewTicker(legacyPollPeriod)
	defer tick.Stop()
	for range tick.C {
		if !m.pollOnce(podID, c) {
			return
		}
	}
}

// pollOnce asks the shim once; false when it is gone.
func (m *Manager) pollOnce(podID string, c *shim.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), shimCallTimeout)
	defer cancel()
	if _, err := c.Info(ctx); errors.Is(err, shim.ErrUnavailable) {
		return false
	}
	for _, id := range m.liveInShim(podID) {
		if st, err := c.State(ctx, id); err == nil {
			m.applyShimEvent(podID, c, shim.Event{Kind: shim.EventState, State: st})
		}
	}
	return true
}

// liveInShim lists what of a pod may still change in its shim: its
// containers not stopped, and the pause of a ready pod that has one.
func (m *Manager) liveInShim(podID string) []string {
	var ids []string
	if pod, err := m.GetPod(podID); err == nil && pod.PausePID > 0 && pod.State == runtimeapi.PodSandboxState_SANDBOX_READY {
		ids = append(ids, pauseID)
	}
	states := m.store.StatesOf(podID)
	for _, st := range states {
		if st.Status != shim.StatusStopped {
			ids = append(ids, st.ID)
		}
	}
	return ids
}

// applyShimEvent records what the shim says of a container; the pause's
// exit makes the pod NOTREADY.
func (m *Manager) applyShimEvent(podID string, c *shim.Client, e shim.Event) {
	if e.State.ID != pauseID {
		m.setContainerState(podID, e.State)
		return
	}
	if e.State.Status == shim.StatusStopped {
		go m.pauseExited(podID, c, e.State) // it waits for the pod's lock
	}
}

// podShim returns a client of the pod's shim, dialing it when berthd has
// none (after a restart). An unreachable shim is shim.ErrUnavailable.
func (m *Manager) podShim(podID string) (*shim.Client, error) {
	if c := m.shim(podID); c != nil {
		return c, nil
	}
	c, err := shim.Dial(m.podDir(podID))
	if err != nil {
		return nil, fmt.Errorf("%w: pod %s: %v", shim.ErrUnavailable, podID, err)
	}
	m.setShim(podID, c)
	return c, nil
}

// forgetShim drops a client whose shim went away.
func (m *Manager) forgetShim(podID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.shims[podID]; c != nil {
		c.Close()
		delete(m.shims, podID)
	}
}

// stopShim deletes the shim's (stopped) containers so libcontainer removes
// their cgroups, then shuts the shim down. A shim that is already gone is
// fine.
func (m *Manager) stopShim(ctx context.Context, podID string, ids []string) error {
	c, err := m.podShim(podID)
	if errors.Is(err, shim.ErrUnavailable) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, shimCallTimeout)
	defer cancel()
	info, err := c.Info(ctx)
	if errors.Is(err, shim.ErrUnavailable) {
		m.forgetShim(podID)
		return nil
	}
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := c.Delete(ctx, id); err != nil && !shim.IsNotFound(err) && !errors.Is(err, shim.ErrUnavailable) {
			return fmt.Errorf("delete container %s: %w", id, err)
		}
	}
	if err := c.Shutdown(ctx); err != nil && !errors.Is(err, shim.ErrUnavailable) {
		return fmt.Errorf("shut down shim of pod %s: %w", podID, err)
	}
	m.forgetShim(podID)
	return waitGone(ctx, info.Pid)
}

// waitGone waits until process pid has exited: the shim may answer
// Shutdown before it is gone, and nothing of a stopped pod may outlive the
// call. A zombie counts as gone: its parent (berthd's shim reaper, or init
// for a shim an earlier berthd started) reaps it. A pidfd turns readable
// at the exit itself; kernels without pidfd_open (before 5.3) poll /proc.
func waitGone(ctx context.Context, pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return pollGone(ctx, pid)
	}
	defer unix.Close(fd)
	for {
		// Bounded, so that ctx is looked at between polls.
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10)
		if n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("shim %d: poll its pidfd: %w", pid, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("shim %d did not exit: %w", pid, ctx.Err())
		}
	}
}

// pollGone is waitGone by reading /proc every 5 ms.
func pollGone(ctx context.Context, pid int) error {
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && bytes.HasPrefix(stat[i+1:], []byte(" Z")) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("shim %d did not exit: %w", pid, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// shimUsage counts the shims berthd is connected to and sums their
// resident memory, read from /proc by the pid each shim wrote.
func (m *Manager) shimUsage() (alive int, rss uint64) {
	m.mu.Lock()
	ids := make([]string, 0, len(m.shims))
	for id := range m.shims {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		b, err := os.ReadFile(filepath.Join(m.podDir(id), shim.PidFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
		if err != nil {
			continue
		}
		n, ok := residentBytes(pid)
		if !ok {
			continue // exited since
		}
		alive++
		rss += n
	}
	return alive, rss
}

// residentBytes is a process's VmRSS.
func residentBytes(pid int) (uint64, bool) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			kb, err := strconv.ParseUint(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
