package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/image/lazyd"
	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCrashPoints kills berthd (SIGKILL, from inside: cri/crashpoint) at
// every crash point a pod's and an image's life passes, restarts it, lets a
// kubelet-style client retry and clean up, and checks that no container the
// client was told about is lost and that no mount, link, IP lease, cgroup,
// pin, shim, image lease or snapshot is left over.
//
// The points are learned, not listed: a first run logs every point it
// passes, so a point added to the code is walked without touching the test.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	// An image with a layer of its own, so that its pull stores a layer and
	// its removal collects one.
	p := e.reg.Push(t, "berth/busybox:crash", harness.BusyboxImage(t, harness.ImageSpec{
		Layers: [][]harness.File{{harness.Reg("crash", "crash test layer\n", 0o644)}}}))
	walkCrashPoints(t, &crashWorkload{e: e, image: p.Name}, func(string) bool { return true })
}

// TestCrashPointsLazy walks the image's crash points with the image pulled
// lazily (an eStargz layer over busybox): a berthd killed with the lazy
// layer prepared, mounted, used by a container or being collected leaves
// no mount, snapshot or cache behind once restarted and cleaned up. The
// pod's points are TestCrashPoints', and so is "pull: config stored": every
// layer is stored by then, the lazy one as at "pull: lazy layer stored",
// and what the point adds, the config blob, is no lazy layer's (each point
// cost the walk about 11 s on this host: two berthd starts, the workload
// and a half).
func TestCrashPointsLazy(t *testing.T) {
	t.Parallel()
	e := startPodEnvTOML(t, v1.Config{}, "\n[image]\nlazy = true\n")
	img, _ := stargzImage(t, nil)
	p := e.reg.Push(t, "berth/lazy:crash", img)
	walkCrashPoints(t, &crashWorkload{e: e, image: p.Name}, func(point string) bool {
		if point == "pull: config stored" {
			return false
		}
		return strings.HasPrefix(point, "pull: ") || strings.Contains(point, "image")
	})
	if m := lazyMounts(t, e.d.Root); len(m) != 0 {
		t.Errorf("lazy mounts left after the walk: %v", m)
	}
}

// walkCrashPoints runs w once to learn the crash points it passes, then
// once per point that keep selects with berthd dying there.
func walkCrashPoints(t *testing.T, w *crashWorkload, keep func(point string) bool) {
	log := filepath.Join(t.TempDir(), "points")
	w.e.d.RestartEnv("BERTH_CRASHPOINT_LOG=" + log)
	if err := w.run(t, 0); err != nil {
		t.Fatalf("the workload without a crash: %v", err)
	}
	w.waitCollected(t)
	points := slices.DeleteFunc(loggedPoints(t, log), func(p string) bool { return !keep(p) })
	if len(points) == 0 {
		t.Fatal("berthd logged no crash point: was it built with the crashpoints tag?")
	}
	for i, point := range points {
		if t.Failed() {
			break // one leak would show at every later point too
		}
		t.Logf("crash point %d/%d: %s", i+1, len(points), point)
		w.crashAt(t, point, uint32(i+1))
	}
	t.Logf("walked %d crash points", len(points))
}

// crashWorkload is one pod's life as the kubelet drives it, with the pull
// and the removal of its image.
type crashWorkload struct {
	e     *podEnv
	image string
	// created are the containers CreateContainer answered for and the
	// client has not removed: a crash must not lose them.
	created []string
}

// run goes through the workload once, as attempt; the first failing call
// ends it (berthd died).
func (w *crashWorkload) run(t *testing.T, attempt uint32) error {
	rt, img := w.e.d.Runtime, w.e.d.Images
	c := t.Context()
	spec := &runtimeapi.ImageSpec{Image: w.image}
	if _, err := img.PullImage(c, &runtimeapi.PullImageRequest{Image: spec}); err != nil {
		return err
	}
	cfg := w.e.podConfig("crash")
	cfg.Metadata.Attempt = attempt
	pod, err := rt.RunPodSandbox(c, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return err
	}
	cc := w.e.ctrConfig("crash", "/bin/sh", "-c", `trap "exit 0" TERM; while :; do sleep 0.1; done`)
	cc.Image = spec
	cc.Metadata.Attempt = attempt
	ctr, err := rt.CreateContainer(c, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: cc, SandboxConfig: cfg})
	if err != nil {
		return err
	}
	w.created = append(w.created, ctr.ContainerId)
	steps := []func() error{
		func() error {
			_, err := rt.StartContainer(c, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId})
			return err
		},
		func() error {
			_, err := rt.StopContainer(c, &runtimeapi.StopContainerRequest{ContainerId: ctr.ContainerId, Timeout: 10})
			return err
		},
		func() error {
			_, err := rt.RemoveContainer(c, &runtimeapi.RemoveContainerRequest{ContainerId: ctr.ContainerId})
			if err == nil {
				w.created = slices.DeleteFunc(w.created, func(id string) bool { return id == ctr.ContainerId })
			}
			return err
		},
		func() error {
			_, err := rt.StopPodSandbox(c, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.PodSandboxId})
			return err
		},
		func() error {
			_, err := rt.RemovePodSandbox(c, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.PodSandboxId})
			return err
		},
		func() error {
			_, err := img.RemoveImage(c, &runtimeapi.RemoveImageRequest{Image: spec})
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// crashAt runs the workload with berthd set to die at point, restarts it,
// checks that nothing the client knew of is lost, retries the workload as
// the next attempt, cleans up what the crash left the way the kubelet's
// garbage collection would, and checks for leaks.
func (w *crashWorkload) crashAt(t *testing.T, point string, attempt uint32) {
	d := w.e.d
	d.RestartEnv("BERTH_CRASHPOINT=" + point)
	// A point of the background image collection comes after the last call.
	if err := w.run(t, attempt*2); err != nil && status.Code(err) != codes.Unavailable {
		t.Errorf("at %q: a call failed with %v, not because berthd died: %v", point, status.Code(err), err)
	}
	select {
	case <-d.Done():
	case <-time.After(10 * time.Second):
		t.Errorf("berthd did not reach crash point %q", point)
	}
	d.RestartEnv()

	listed := w.e.listContainerIDs(t, nil)
	for _, id := range w.created {
		if !slices.Contains(listed, id) {
			t.Errorf("at %q: container %s, created before the crash, is lost", point, id)
		}
	}
	if err := w.run(t, attempt*2+1); err != nil {
		t.Errorf("at %q: the retry after the restart failed: %v", point, err)
	}
	w.cleanUp(t)
	w.waitCollected(t)
	// Mounts under berthd's folders, idmapped layers included, are leaks
	// there; other daemons' (their start probes) are not this test's.
	w.e.assertNoLeaks(t)
}

// cleanUp removes every pod and container berthd lists, and the workload's
// image, as the kubelet's garbage collection does with what it no longer
// wants.
func (w *crashWorkload) cleanUp(t *testing.T) {
	c, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rt := w.e.d.Runtime
	for _, id := range w.e.listContainerIDs(t, nil) {
		if _, err := rt.RemoveContainer(c, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("RemoveContainer %s after the crash: %v", id, err)
		}
	}
	w.created = nil
	for _, id := range w.e.listPodIDs(t, nil) {
		if _, err := rt.StopPodSandbox(c, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Errorf("StopPodSandbox %s after the crash: %v", id, err)
		}
		if _, err := rt.RemovePodSandbox(c, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Errorf("RemovePodSandbox %s after the crash: %v", id, err)
		}
	}
	if _, err := w.e.d.Images.RemoveImage(c, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: w.image}}); err != nil {
		t.Errorf("RemoveImage after the crash: %v", err)
	}
}

// waitCollected waits until the background collection has removed the
// layers of removed images: the snapshot folders are those of the stored
// images again.
func (w *crashWorkload) waitCollected(t *testing.T) {
	t.Helper()
	want := w.e.storedLayers(t)
	if !eventually(10*time.Second, func() bool { return len(harness.Leaks(w.e.d.Root, harness.WantSnapshots(want))) == 0 }) {
		t.Errorf("layers not collected: %v", harness.Leaks(w.e.d.Root, harness.WantSnapshots(want)))
	}
}

// loggedPoints reads the crash points a run passed, each once, in order.
func loggedPoints(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("crash point log: %v", err)
	}
	var points []string
	for p := range strings.Lines(string(b)) {
		if p = strings.TrimSuffix(p, "\n"); !slices.Contains(points, p) {
			points = append(points, p)
		}
	}
	return points
}

// TestCrashPointsLazyServer kills the lazy layer server (image/lazyd) at
// each of its crash points (a layer mounted before berthd heard back, the
// background fetch with chunks stored, the layer verified and its kept
// bytes dropped but not marked complete), as a crash of the server alone
// would. berthd, restarted, finds no server: it detaches the dead mount
// and drops the incomplete layer with its image, never serving a layer
// as complete that is not; the pull again (the kubelet's retry) starts a
// new server, a container reads the right bytes, the layer completes, and
// removing it all leaves no mount, server, cache or snapshot. (A berthd
// killed during the background fetch is TestPullLazyServesWhileBerthdDown's:
// the server fetches on without it.)
func TestCrashPointsLazyServer(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	img, l := stargzImage(t, nil)
	p := reg.Push(t, "berth/lazy:server-crash", img)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: lazyConfig(reg)})
	// One pull, a container reading the layer, and removal of it all.
	useAndRemove := func(point string) {
		t.Helper()
		mustPull(t, d, p.Name, p.ID)
		e, ctr := runReader(t, d, reg, p.Name)
		if got := e.exec(t, ctr, "cat", "/data/big"); got.code != 0 || got.stdout != string(l.big) {
			t.Fatalf("at %q: cat /data/big: exit %d, %d bytes, stderr %q", point, got.code, len(got.stdout), got.stderr)
		}
		waitComplete(t, d.Root, 1)
		removeAllLazy(t, e)
	}

	log := filepath.Join(t.TempDir(), "points")
	d.RestartEnv("BERTH_CRASHPOINT_LOG=" + log)
	useAndRemove("none")
	points := slices.DeleteFunc(loggedPoints(t, log), func(p string) bool { return !strings.HasPrefix(p, "lazy ") })
	if len(points) < 4 {
		t.Fatalf("the lazy layer server logged crash points %v, want its four", points)
	}
	for i, point := range points {
		t.Logf("lazy layer server crash point %d/%d: %s", i+1, len(points), point)
		d.RestartEnv(lazyd.CrashPointEnv + "=" + point)
		pull(t, d, p.Name, nil) // fails at "lazy serve: layer mounted"
		if !eventually(time.Minute, func() bool { return len(d.LazyServerPIDs()) == 0 }) {
			t.Fatalf("the lazy layer server did not reach crash point %q", point)
		}
		d.RestartEnv()
		if m, f := lazyMounts(t, d.Root), lazyFolders(t, d.Root); len(m) != 0 || len(f) != 0 {
			t.Fatalf("at %q, after the restart: lazy mounts %v, cache folders %v; want the incomplete layer dropped", point, m, f)
		}
		useAndRemove(point)
	}
}
