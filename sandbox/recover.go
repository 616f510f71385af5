package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-runtime/berth/sandbox/podfiles"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/rootfs"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// recover reconnects to the shims of the pods berthd had. A ready pod whose
// shim is gone (killed, or the machine rebooted and wiped the state folder)
// becomes NOTREADY, what is left running of its containers is killed and
// its namespace pins are released; its containers then report EXITED from
// their exit records. Half-created pods and containers
// are left to the kubelet's StopPodSandbox/RemovePodSandbox, which undo
// whatever exists of them.
func (m *Manager) recover() error {
	if err := podns.PrepareRoot(m.podsDir()); err != nil {
		return err
	}
	pods, err := m.ListPods(store.Filter{})
	if err != nil {
		return err
	}
	live := map[string]bool{} // pods that keep their network
	for _, pod := range pods {
		c, err := m.podShim(pod.ID)
		if err == nil {
			if err = m.recoverStates(pod.ID, c); errors.Is(err, context.DeadlineExceeded) {
				// Wedged, not gone: its containers may run. Keep the pod as
				// it is, its containers as their records say; the
				// kubelet's calls will time out on it.
				m.log.Error("pod shim does not answer: pod left as it is", "pod", pod.ID, "after", recoveryCallTimeout)
				m.loadRecordedStates(pod.ID, nil, false)
				live[pod.ID] = pod.State == runtimeapi.PodSandboxState_SANDBOX_READY
				m.metrics.Recovered("unresponsive")
				continue
			}
			if err != nil {
				m.forgetShim(pod.ID)
			}
		}
		if err == nil {
			m.log.Info("reconnected to pod shim", "pod", pod.ID)
			m.metrics.Recovered("reconnected")
			live[pod.ID] = pod.State == runtimeapi.PodSandboxState_SANDBOX_READY
			continue
		}
		if !errors.Is(err, shim.ErrUnavailable) {
			return err
		}
		if pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			m.loadRecordedStates(pod.ID, nil, true)
			continue
		}
		m.log.Warn("pod shim is gone: pod is not ready", "pod", pod.ID, "err", err)
		m.metrics.Recovered("lost")
		if err := m.shimLost(store.ClonePod(pod)); err != nil { // listed pods are the store's: change a copy
			m.log.Error("clean up after a lost shim", "pod", pod.ID, "err", err)
		}
	}
	if err := m.reclaimUnknown(pods); err != nil {
		m.log.Error("reclaim what no record names", "err", err)
	}
	// Leases, links and host port rules of pods that are gone or stopped.
	// A failure leaves the network not ready (NetworkReady=false says why)
	// rather than berthd down: pods already running keep being served.
	if err := m.opts.Network.Reconcile(context.Background(), live); err != nil {
		m.log.Error("pod network not reconciled", "err", err)
	}
	return nil
}

// recoveryCallTimeout bounds each shim call at start, so that one shim that
// accepts but never answers does not keep berthd from serving.
const recoveryCallTimeout = 3 * time.Second

// askStates is the snapshot a shim from before Events would give: the
// state of each of the pod's containers (and pause) it has.
func (m *Manager) askStates(ctx context.Context, podID string, c *shim.Client) (shim.EventsReply, error) {
	var r shim.EventsReply
	for _, id := range m.liveInShim(podID) {
		st, err := c.State(ctx, id)
		if shim.IsNotFound(err) {
			continue
		}
		if err != nil {
			return r, err
		}
		r.Events = append(r.Events, shim.Event{Kind: shim.EventState, State: st})
	}
	return r, nil
}

// recoverStates asks the shim for the state of every container it has
// (its pause's exit included); the pod's other containers are as their
// records say.
func (m *Manager) recoverStates(podID string, c *shim.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), recoveryCallTimeout)
	defer cancel()
	r, err := c.Events(ctx, 0)
	if errors.Is(err, shim.ErrNoEvents) { // a shim from before: ask each
		r, err = m.askStates(ctx, podID, c)
	}
	if err != nil {
		return err
	}
	told := map[string]bool{}
	for _, e := range r.Events {
		id := e.State.ID
		if e.Kind == shim.EventState && id != pauseID && !m.knownContainer(id) {
			// Made in the shim by a create whose record berthd lost (it
			// died before the record's write, or the create was undone
			// while the shim was out of reach): nothing else would ever
			// stop it.
			m.log.Warn("killing a container its pod shim has and no record names", "pod", podID, "container", id)
			if err := m.discardInShim(ctx, c, id); err != nil {
				m.log.Error("kill an unknown container", "pod", podID, "container", id, "err", err)
			}
			continue
		}
		told[id] = true
		m.applyShimEvent(podID, c, e)
	}
	m.loadRecordedStates(podID, told, true)
	return nil
}

// knownContainer: berthd has a record of exactly this container.
func (m *Manager) knownContainer(id string) bool {
	c, _, err := m.store.Container(id)
	return err == nil && c.ID == id
}

// reclaimUnknown removes what a crash left that no record names: pod
// folders, container bundles and writable layers, and image leases of
// containers that do not exist.
func (m *Manager) reclaimUnknown(pods []*store.Pod) error {
	ctrs := m.store.ContainersOf("")
	knownPods, knownCtrs := map[string]bool{}, map[string]bool{pauseID: true}
	for _, p := range pods {
		knownPods[p.ID] = true
	}
	for _, c := range ctrs {
		knownCtrs[c.ID] = true
	}
	var errs []error
	for _, id := range unknownEntries(m.podsDir(), knownPods) {
		errs = append(errs, m.reclaimPodFolder(id))
	}
	for _, p := range pods {
		for _, id := range unknownEntries(filepath.Join(m.podDir(p.ID), "containers"), knownCtrs) {
			errs = append(errs, m.reclaimBundle(p.ID, id))
		}
	}
	for _, r := range m.layerRoots() {
		for _, id := range unknownEntries(filepath.Join(r, "containers"), knownCtrs) {
			m.log.Warn("removing the writable layer of an unknown container", "container", id)
			errs = append(errs, os.RemoveAll(filepath.Join(r, "containers", id)))
		}
	}
	owners, err := m.opts.Images.LeaseOwners()
	errs = append(errs, err)
	for _, o := range owners {
		if !knownCtrs[leaseContainer(o)] {
			m.log.Warn("releasing the image lease of an unknown container", "container", leaseContainer(o), "lease", o)
			errs = append(errs, m.opts.Images.Release(o))
		}
	}
	return errors.Join(errs...)
}

// unknownEntries lists the folders in dir whose names known lacks.
func unknownEntries(dir string, known map[string]bool) []string {
	entries, _ := os.ReadDir(dir) // a missing folder has nothing unknown
	var out []string
	for _, e := range entries {
		if e.IsDir() && !known[e.Name()] {
			out = append(out, e.Name())
		}
	}
	return out
}

// reclaimPodFolder removes a pod folder without a record, with its pins,
// shm mount and container rootfs mounts. One whose shim still answers is
// left alone (logged): its containers may run, and nothing else names them.
func (m *Manager) reclaimPodFolder(id string) error {
	if c, err := shim.Dial(m.podDir(id)); err == nil {
		c.Close()
		m.log.Error("a pod folder without a record has a live shim: left alone", "dir", m.podDir(id))
		return nil
	}
	m.log.Warn("removing the folder of an unknown pod", "pod", id)
	errs := []error{podns.Remove(m.nsDir(id)), podfiles.Remove(m.podDir(id))}
	for _, c := range unknownEntries(filepath.Join(m.podDir(id), "containers"), nil) {
		errs = append(errs, m.reclaimBundle(id, c))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.RemoveAll(m.podDir(id))
}

// reclaimBundle unmounts and removes the bundle of a container without a
// record.
func (m *Manager) reclaimBundle(podID, id string) error {
	m.log.Warn("removing the bundle of an unknown container", "pod", podID, "container", id)
	if err := rootfs.Unmount(rootfs.Layout{Target: filepath.Join(m.bundleDir(podID, id), "rootfs")}); err != nil {
		return err
	}
	if err := m.unmountImageVolumes(podID, id); err != nil {
		return err
	}
	return m.removeBundle(podID, id)
}

// removeBundle removes a container's bundle folder, and first the TARGET
// PID namespace pin that lives in it until the shim created the container:
// a create whose rollback stopped early (its record kept), or a crash in
// between, leaves the pin mounted there, which the removal would fail on.
func (m *Manager) removeBundle(podID, id string) error {
	dir := m.bundleDir(podID, id)
	if err := podns.RemovePin(filepath.Join(dir, targetPIDPin)); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
