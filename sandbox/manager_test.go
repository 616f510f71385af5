package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/rpc"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/berth-runtime/berth/sandbox/store/storetest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Unit tests of pod runs and teardowns without root: host namespaces (no
// pins to make), fake cgroups and a fake shim that speaks the shim's
// protocol on the pod folder's socket.

type fakeCgroups struct {
	mu        sync.Mutex
	failNext  error
	removeErr []error // RemovePod's next results, first first
	mode      cgroups.Mode
	live      map[string]bool
	removedAt []string
}

func (f *fakeCgroups) Mode() cgroups.Mode                      { return f.mode }
func (f *fakeCgroups) PodCgroup(parent, uid string) string     { return parent + "/pod" + uid }
func (f *fakeCgroups) ContainerCgroupsPath(p, c string) string { return p + "/" + c }
func (f *fakeCgroups) Kill(string) error                       { return nil }
func (f *fakeCgroups) Freeze(string, bool) error               { return nil }
func (f *fakeCgroups) Stats(string) (cgroups.Stats, error)     { return cgroups.Stats{}, os.ErrNotExist }
func (f *fakeCgroups) Details(string) (cgroups.Details, error) {
	return cgroups.Details{}, os.ErrNotExist
}

func (f *fakeCgroups) CreatePod(p string, _ *runtimeapi.LinuxContainerResources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failNext; err != nil {
		f.failNext = nil
		return err
	}
	f.live[p] = true
	return nil
}

func (f *fakeCgroups) RemovePod(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.removeErr) > 0 {
		err := f.removeErr[0]
		f.removeErr = f.removeErr[1:]
		return err
	}
	delete(f.live, p)
	f.removedAt = append(f.removedAt, p)
	return nil
}

// fakeShim answers the calls a pod without containers gets.
type fakeShim struct {
	quit     chan struct{}
	quitOnce sync.Once
}

// Pid names no process: stopShim's wait for the shim's exit ends at once.
func (f *fakeShim) Info(_ *shim.Empty, r *shim.Info) error    { *r = shim.Info{Pid: 1 << 30}; return nil }
func (f *fakeShim) Delete(*shim.IDRequest, *shim.Empty) error { return nil }

// Kill: the fake makes no containers.
func (f *fakeShim) Kill(req *shim.KillRequest, _ *shim.Empty) error {
	return fmt.Errorf("%w: %s", shim.ErrNotFound, req.ID)
}
func (f *fakeShim) Shutdown(*shim.Empty, *shim.Empty) error {
	f.quitOnce.Do(func() { close(f.quit) })
	return nil
}

func (f *fakeShim) Events(req *shim.EventsRequest, r *shim.EventsReply) error {
	if req.After == 0 {
		*r = shim.EventsReply{Seq: 1, Snapshot: true}
		return nil
	}
	<-f.quit
	*r = shim.EventsReply{Seq: req.After, Quit: true}
	return nil
}

// legacyShim is a shim from before Events: berthd asks it for states.
type legacyShim struct{ f *fakeShim } // not embedded: no Events

func (l legacyShim) Info(a *shim.Empty, r *shim.Info) error        { return l.f.Info(a, r) }
func (l legacyShim) Delete(a *shim.IDRequest, r *shim.Empty) error { return l.f.Delete(a, r) }
func (l legacyShim) Shutdown(a *shim.Empty, r *shim.Empty) error   { return l.f.Shutdown(a, r) }
func (legacyShim) State(req *shim.IDRequest, _ *shim.State) error {
	return fmt.Errorf("%w: %s", shim.ErrNotFound, req.ID)
}

// testManager is a Manager on a fresh database, without root: what it
// knows of pods and containers is their records.
func testManager(t testing.TB) *Manager {
	t.Helper()
	db, root := storetest.OpenDB(t), t.TempDir()
	st, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{opts: Options{DB: db, State: t.TempDir(), Root: root, ContainerRoot: root}, log: slog.New(slog.DiscardHandler),
		shims: map[string]*shim.Client{}, store: st}
	if m.stats, err = m.newStats(); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *Manager) addTestPod(t testing.TB, id string, state runtimeapi.PodSandboxState, labels map[string]string) {
	t.Helper()
	storetest.AddPod(t, m.store, id, state, labels)
}

func (m *Manager) addTestContainer(t testing.TB, id, podID string) {
	t.Helper()
	storetest.AddContainer(t, m.store, id, podID)
}

// reloadStore is a store loaded afresh from m's database: what its
// records say.
func reloadStore(t *testing.T, m *Manager) *store.Store {
	t.Helper()
	s, err := store.Open(m.opts.DB)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startFakeShim serves a fakeShim (a legacyShim if legacy) on podDir's
// socket until it is shut down; its first start fails with fail, when set.
// Each shim it starts is added to started, when not nil.
func startFakeShim(t *testing.T, fail error, legacy bool, started *[]*fakeShim) ShimStarter {
	return func(_ context.Context, podDir string) (*shim.Client, error) {
		if err := fail; err != nil {
			fail = nil
			return nil, err
		}
		l, err := shim.Listen(podDir)
		if err != nil {
			return nil, err
		}
		f := &fakeShim{quit: make(chan struct{})}
		if started != nil {
			*started = append(*started, f)
		}
		var api any = f
		if legacy {
			api = legacyShim{f}
		}
		srv := rpc.NewServer()
		if err := srv.RegisterName(shim.ServiceName, api); err != nil {
			return nil, err
		}
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return // shut down
				}
				go srv.ServeConn(conn)
			}
		}()
		go func() { <-f.quit; l.Close() }()
		t.Cleanup(func() { f.quitOnce.Do(func() { close(f.quit) }) })
		return shim.Dial(podDir)
	}
}

func podManager(t *testing.T, shimErr error) (*Manager, *fakeCgroups) {
	m := testManager(t)
	cg := &fakeCgroups{live: map[string]bool{}}
	m.opts.Cgroups, m.opts.StartShim = cg, startFakeShim(t, shimErr, false, nil)
	return m, cg
}

func hostPodConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + name},
		Linux: &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/test", SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE,
				Ipc: runtimeapi.NamespaceMode_NODE, Pid: runtimeapi.NamespaceMode_CONTAINER}}},
	}
}

// TestRunPodRollsBack: a step that fails undoes the ones before it: no
// record (in memory or bolt), folder or cgroup is left, and the name is
// free again.
func TestRunPodRollsBack(t *testing.T) {
	for _, c := range []struct {
		name               string
		cgroupErr, shimErr error
		wantCgroupRemoved  bool
		wantShims          int // started (and shut down)
	}{
		{"cgroup", errors.New("no cgroup for you"), nil, false, 1},
		{"shim", nil, errors.New("no shim for you"), true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, cg := podManager(t, nil)
			var shims []*fakeShim
			m.opts.StartShim = startFakeShim(t, c.shimErr, false, &shims)
			cg.failNext = c.cgroupErr
			if _, err := m.RunPod(t.Context(), hostPodConfig("p")); err == nil {
				t.Fatal("RunPod succeeded")
			}
			if pods, _ := m.ListPods(store.Filter{}); len(pods) != 0 {
				t.Errorf("pods after a failed run: %v", pods)
			}
			if pods, err := reloadStore(t, m).ListPods(store.Filter{}); err != nil || len(pods) != 0 {
				t.Errorf("records in bolt after a failed run: %v %v", pods, err)
			}
			if entries, _ := os.ReadDir(m.podsDir()); len(entries) != 0 {
				t.Errorf("pod folders left: %v", entries)
			}
			if len(cg.live) != 0 || (len(cg.removedAt) == 1) != c.wantCgroupRemoved {
				t.Errorf("cgroups live %v, removed %v", cg.live, cg.removedAt)
			}
			// The shim starts alongside the first steps: one started before
			// a failure is shut down.
			if len(shims) != c.wantShims {
				t.Errorf("%d shims started, want %d", len(shims), c.wantShims)
			}
			for i, f := range shims {
				select {
				case <-f.quit:
				default:
					t.Errorf("shim %d of %d not shut down", i+1, len(shims))
				}
			}
			if _, err := m.RunPod(t.Context(), hostPodConfig("p")); err != nil {
				t.Errorf("the same pod once the fault is gone: %v", err)
			}
		})
	}
}

// TestPodNamesStopRemoveAndEvents: a pod's metadata runs once until it is
// removed; stop and remove are idempotent, also for unknown pods; each
// step is one event, in order, with the pod as it was then.
func TestPodNamesStopRemoveAndEvents(t *testing.T) {
	m, cg := podManager(t, nil)
	sub := m.Subscribe()
	defer sub.Close()
	ctx := t.Context()
	pod, err := m.RunPod(ctx, hostPodConfig("p"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.RunPod(ctx, hostPodConfig("p")); !errors.Is(err, errkind.AlreadyExists) {
		t.Errorf("second run of the same metadata: %v, want errkind.AlreadyExists", err)
	}
	for range 2 {
		if err := m.StopPod(ctx, pod.ID[:8]); err != nil {
			t.Fatalf("StopPod: %v", err)
		}
	}
	if p, err := m.GetPod(pod.ID); err != nil || p.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("after stop: %v %v, want NOTREADY", p, err)
	}
	for range 2 {
		if err := m.RemovePod(ctx, pod.ID); err != nil {
			t.Fatalf("RemovePod: %v", err)
		}
	}
	for _, id := range []string{"0123456789abcdef", pod.ID} {
		if err := m.StopPod(ctx, id); err != nil {
			t.Errorf("StopPod(unknown %s): %v", id, err)
		}
		if err := m.RemovePod(ctx, id); err != nil {
			t.Errorf("RemovePod(unknown %s): %v", id, err)
		}
	}
	if _, err := m.GetPod(pod.ID); !errors.Is(err, errkind.NotFound) {
		t.Errorf("GetPod after remove: %v, want errkind.NotFound", err)
	}
	if len(cg.live) != 0 {
		t.Errorf("cgroups left: %v", cg.live)
	}
	want := []struct {
		typ   runtimeapi.ContainerEventType
		state runtimeapi.PodSandboxState
	}{
		{store.EventContainerCreated, runtimeapi.PodSandboxState_SANDBOX_READY},
		{store.EventContainerStarted, runtimeapi.PodSandboxState_SANDBOX_READY},
		{store.EventContainerStopped, runtimeapi.PodSandboxState_SANDBOX_NOTREADY},
		{store.EventContainerDeleted, runtimeapi.PodSandboxState_SANDBOX_NOTREADY},
	}
	for _, w := range want {
		select {
		case ev := <-sub.C:
			if ev.Type != w.typ || ev.ContainerID != pod.ID || ev.Pod.ID != pod.ID || ev.Pod.State != w.state {
				t.Fatalf("event %v %s, pod %s %v; want %v %s, %v", ev.Type, ev.ContainerID, ev.Pod.ID, ev.Pod.State, w.typ, pod.ID, w.state)
			}
		default:
			t.Fatalf("no %v event", w.typ)
		}
	}
	select {
	case ev := <-sub.C:
		t.Errorf("unexpected event %v", ev.Type)
	default:
	}
	if _, err := m.RunPod(ctx, hostPodConfig("p")); err != nil {
		t.Errorf("the same metadata after the removal: %v", err)
	}
}

// TestShimWithoutEvents: a shim from before the Events call (one that
// outlived an upgrade of berth) is asked for states instead; its pod is
// not taken for lost, and stops and goes as any other.
func TestShimWithoutEvents(t *testing.T) {
	m, cg := podManager(t, nil)
	m.opts.StartShim = startFakeShim(t, nil, true, nil)
	pod, err := m.RunPod(t.Context(), hostPodConfig("old"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(legacyPollPeriod + 500*time.Millisecond) // a poll or two
	p, err := m.GetPod(pod.ID)
	if err != nil || p.State != runtimeapi.PodSandboxState_SANDBOX_READY || m.shim(pod.ID) == nil {
		t.Fatalf("pod of a shim without events: %v, followed %v; want READY, still followed", err, m.shim(pod.ID) != nil)
	}
	if err := m.RemovePod(t.Context(), pod.ID); err != nil {
		t.Fatal(err)
	}
	if len(cg.live) != 0 {
		t.Errorf("cgroups left: %v", cg.live)
	}
}
