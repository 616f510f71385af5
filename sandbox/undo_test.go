package sandbox

import (
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/store"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fastUndoRetries makes the undo's retries quick for the test.
func fastUndoRetries(t *testing.T) {
	old := undoRetryDelays
	undoRetryDelays = []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}
	t.Cleanup(func() { undoRetryDelays = old })
}

// TestUndoRetriesAndStops: a step that fails busy is retried a bounded
// number of times; one that still fails (or fails for good) stops the
// rollback there, with an error naming it, and the steps recorded before it
// are not run.
func TestUndoRetriesAndStops(t *testing.T) {
	fastUndoRetries(t)
	attempts := len(undoRetryDelays) + 1
	for _, c := range []struct {
		name      string
		errs      []error // the middle step's results, first first; nil after
		wantCalls int
		wantErr   bool
	}{
		{"busy twice", []error{unix.EBUSY, unix.EBUSY}, 3, false},
		{"busy for good", repeat(unix.EBUSY, 10), attempts, true},
		{"permanent", []error{unix.EPERM}, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ran []string
			calls := 0
			u := &undo{log: slog.New(slog.DiscardHandler), op: "test"}
			u.add("first", func() error { ran = append(ran, "first"); return nil })
			u.add("middle", func() error {
				calls++
				if len(c.errs) > 0 {
					err := c.errs[0]
					c.errs = c.errs[1:]
					return err
				}
				return nil
			})
			u.add("last", func() error { ran = append(ran, "last"); return nil })
			err := u.run()
			if calls != c.wantCalls {
				t.Errorf("middle step tried %d times, want %d", calls, c.wantCalls)
			}
			if c.wantErr {
				if err == nil || !strings.Contains(err.Error(), `"middle"`) {
					t.Errorf("run = %v, want the middle step's failure", err)
				}
				if strings.Join(ran, " ") != "last" {
					t.Errorf("steps run: %v, want only last (the one before the failure is kept)", ran)
				}
				return
			}
			if err != nil || strings.Join(ran, " ") != "last first" {
				t.Errorf("run = %v, steps %v; want nil, last first", err, ran)
			}
		})
	}
}

func repeat(err error, n int) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// TestRunPodKeepsRecordWhenRollbackFails: when RunPod fails and its
// rollback cannot remove the pod's cgroup, the pod stays, NOTREADY, in
// memory and in bolt, saying what failed, with its folder and cgroup; once
// the cgroup can go, RemovePod finishes it and the name is free again. A
// cgroup that is busy only for a moment is retried and the rollback ends
// clean.
func TestRunPodKeepsRecordWhenRollbackFails(t *testing.T) {
	fastUndoRetries(t)
	t.Run("kept", func(t *testing.T) {
		m, cg := podManager(t, errors.New("no shim for you"))
		cg.removeErr = repeat(errors.New("cgroup in use: remove it later"), 1)
		if _, err := m.RunPod(t.Context(), hostPodConfig("p")); err == nil {
			t.Fatal("RunPod succeeded")
		}
		pods, _ := m.ListPods(store.Filter{})
		if len(pods) != 1 {
			t.Fatalf("pods after a failed rollback: %v, want the pod kept", pods)
		}
		pod := pods[0]
		if pod.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY || !strings.Contains(pod.CleanupFailed, "remove pod cgroup") {
			t.Errorf("kept pod: %v, cleanupFailed %q; want NOTREADY, naming the failed step", pod.State, pod.CleanupFailed)
		}
		if kept, err := reloadStore(t, m).Pod(pod.ID); err != nil || kept.CleanupFailed == "" {
			t.Errorf("record in bolt: %v %v; want the kept pod, marked", kept, err)
		}
		if _, err := os.Stat(m.podDir(pod.ID)); err != nil || !cg.live[pod.Cgroup] {
			t.Errorf("the kept pod's folder (%v) and cgroup (%v) should stay for RemovePod", err, cg.live)
		}
		if err := m.RemovePod(t.Context(), pod.ID); err != nil {
			t.Fatalf("RemovePod: %v", err)
		}
		if pods, _ := m.ListPods(store.Filter{}); len(pods) != 0 || len(cg.live) != 0 {
			t.Errorf("after RemovePod: pods %v, cgroups %v", pods, cg.live)
		}
		if entries, _ := os.ReadDir(m.podsDir()); len(entries) != 0 {
			t.Errorf("pod folders left: %v", entries)
		}
		if _, err := m.RunPod(t.Context(), hostPodConfig("p")); err != nil {
			t.Errorf("the same pod once removed: %v", err)
		}
	})
	t.Run("busy for a moment", func(t *testing.T) {
		m, cg := podManager(t, errors.New("no shim for you"))
		cg.removeErr = []error{unix.EBUSY, unix.EBUSY}
		if _, err := m.RunPod(t.Context(), hostPodConfig("p")); err == nil {
			t.Fatal("RunPod succeeded")
		}
		if pods, _ := m.ListPods(store.Filter{}); len(pods) != 0 || len(cg.live) != 0 {
			t.Errorf("after a retried rollback: pods %v, cgroups %v; want none", pods, cg.live)
		}
	})
}

// fakeImages has one image, whose layers are a folder that does not exist
// (so that mounting a rootfs fails), and fails Release with releaseErr
// once, when set.
type fakeImages struct {
	releaseErr error
	leased     map[string]bool
}

func (f *fakeImages) Get(ref string) (*image.Image, error) {
	return &image.Image{ID: "sha256:img"}, nil
}
func (f *fakeImages) Lease(owner string, _ *image.Image) ([]string, error) {
	f.leased[owner] = true
	return []string{"/nonexistent/berth-test-layer"}, nil
}

func (f *fakeImages) Release(owner string) error {
	if err := f.releaseErr; err != nil {
		f.releaseErr = nil
		return err
	}
	delete(f.leased, owner)
	return nil
}

func (f *fakeImages) LeaseOwners() ([]string, error) { return slices.Collect(maps.Keys(f.leased)), nil }

// TestCreateContainerKeepsRecordWhenRollbackFails: when CreateContainer
// fails and its rollback cannot release the image lease, the container
// stays, in memory and in bolt, reported exited and saying what failed,
// with its lease; RemoveContainer then releases it and removes the record.
func TestCreateContainerKeepsRecordWhenRollbackFails(t *testing.T) {
	fastUndoRetries(t)
	m, cg := podManager(t, nil)
	cg.mode = cgroups.V2 // for the container's resources
	images := &fakeImages{releaseErr: errors.New("lease store unavailable"), leased: map[string]bool{}}
	m.opts.Images, m.opts.ContainerRoot = images, t.TempDir()
	pod, err := m.RunPod(t.Context(), hostPodConfig("p"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, Image: &runtimeapi.ImageSpec{Image: "img"}}
	if _, err := m.CreateContainer(t.Context(), pod.ID, cfg); err == nil || !strings.Contains(err.Error(), "rootfs: mount") {
		t.Fatalf("CreateContainer = %v, want the mount's failure", err)
	}
	list, _ := m.ListContainers(t.Context(), store.Filter{})
	if len(list) != 1 {
		t.Fatalf("containers after a failed rollback: %v, want the container kept", list)
	}
	c := list[0]
	if c.State != runtimeapi.ContainerState_CONTAINER_EXITED || !strings.Contains(c.Message, "release image layers") || !images.leased[c.ID] {
		t.Errorf("kept container: %v %q, leased %v; want EXITED, naming the failed step, its lease kept", c.State, c.Message, images.leased)
	}
	if kept := reloadStore(t, m).ContainersOf(""); len(kept) != 1 || kept[0].CleanupFailed == "" {
		t.Errorf("container records in bolt: %v; want the kept container, marked", kept)
	}
	if err := m.StartContainer(t.Context(), c.ID); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("StartContainer of the kept container = %v, want FailedPrecondition", err)
	}
	// A TARGET container's create that stopped before its pin's undo
	// leaves the pin mounted in the bundle: RemoveContainer must take it
	// (the bundle's removal would fail on it for ever). Pins are bind
	// mounts: root only, as make test runs.
	pin := filepath.Join(m.bundleDir(pod.ID, c.ID), targetPIDPin)
	if os.Geteuid() == 0 {
		// This rollback stopped later, after the bundle's removal: put the
		// bundle back as an earlier stop would have left it.
		if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := podns.PinProcessAt(pin, podns.PID, os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.RemoveContainer(t.Context(), c.ID); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	if _, err := os.Lstat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the target PID namespace pin is still there after RemoveContainer: %v", err)
	}
	if list, _ := m.ListContainers(t.Context(), store.Filter{}); len(list) != 0 || len(images.leased) != 0 {
		t.Errorf("after RemoveContainer: containers %v, leases %v", list, images.leased)
	}
	if _, err := m.CreateContainer(t.Context(), pod.ID, cfg); err == nil || !strings.Contains(err.Error(), "rootfs: mount") {
		t.Errorf("the same container again: %v, want the mount's failure, not a name taken", err)
	}
}
