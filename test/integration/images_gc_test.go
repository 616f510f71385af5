package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// prompt bounds calls that must not wait behind a slow pull: generous for a
// loaded CI machine, far below the minutes the trickled pull takes.
const prompt = 30 * time.Second

// TestSlowPullBlocksNothing keeps one pull in progress (its top layer
// trickles in for minutes) while containers are created and removed, other
// images pulled and removed: none of these waits for the slow pull, and the
// layers they leave unused are still collected.
func TestSlowPullBlocksNothing(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	random := make([]byte, 16<<10)
	if _, err := rand.Read(random); err != nil {
		t.Fatal(err)
	}
	slow := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("slow", hex.EncodeToString(random), 0o644)}}})
	ps := e.reg.Push(t, "berth/slow:1", slow)
	top := topLayer(t, slow)
	e.reg.Trickle(top, 16, 100*time.Millisecond) // 160 B/s: minutes for the layer

	slowCtx, cancelSlow := context.WithCancel(t.Context())
	slowDone := make(chan error, 1)
	go func() {
		_, err := e.d.Images.PullImage(slowCtx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ps.Name}})
		slowDone <- err
	}()
	if !eventually(prompt, func() bool { return e.reg.Fetches(top) > 0 }) {
		t.Fatal("the slow pull never started fetching its trickled layer")
	}

	within := func(what string, fn func(context.Context) error) {
		t.Helper()
		c, cancel := context.WithTimeout(t.Context(), prompt)
		defer cancel()
		begin := time.Now()
		if err := fn(c); err != nil {
			t.Fatalf("%s while a pull trickles (after %s): %v", what, time.Since(begin).Round(time.Millisecond), err)
		}
	}
	podCfg := e.podConfig("beside-slow-pull")
	pod := e.runPod(t, podCfg)
	for i := range 3 { // each removal releases a lease, which asks for a collection
		var id string
		within("CreateContainer", func(c context.Context) error {
			r, err := e.d.Runtime.CreateContainer(c, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: podCfg,
				Config: e.ctrConfig("c", "/bin/true")})
			id = r.GetContainerId()
			return err
		})
		within("RemoveContainer", func(c context.Context) error {
			_, err := e.d.Runtime.RemoveContainer(c, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		})
		t.Logf("round %d: created and removed a container beside the slow pull", i)
	}

	other := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("other", "other", 0o644)}}})
	po := e.reg.Push(t, "berth/other:1", other)
	within("PullImage of another image", func(c context.Context) error {
		_, err := e.d.Images.PullImage(c, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: po.Name}})
		return err
	})
	if hits := harness.FindInSnapshots(t, e.d.Root, "other"); len(hits) != 1 {
		t.Fatalf("the other image's layer is in %d snapshots, want 1", len(hits))
	}
	within("RemoveImage", func(c context.Context) error {
		_, err := e.d.Images.RemoveImage(c, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: po.ID}})
		return err
	})
	if !eventually(prompt, func() bool { return len(harness.FindInSnapshots(t, e.d.Root, "other")) == 0 }) {
		t.Error("the removed image's own layer was not collected while the slow pull ran")
	}
	if len(harness.FindInSnapshots(t, e.d.Root, "bin/busybox")) != 1 {
		t.Error("the busybox layer (used by the slow pull and the pod's image) was collected")
	}

	// A long pull says how far it got every 10 s.
	progress := regexp.MustCompile(`msg="pull in progress" .*ref=` + regexp.QuoteMeta(ps.Name) + ` bytes=[1-9]`)
	if !eventually(15*time.Second, func() bool { return progress.MatchString(e.d.Logs()) }) {
		t.Error("no \"pull in progress\" line with the bytes received for the slow pull")
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the trickled pull ended before the test cancelled it: %v", err)
	default:
	}
	cancelSlow()
	if err := <-slowDone; err == nil {
		t.Error("the cancelled slow pull succeeded")
	}
	e.removePod(t, pod)
	assertAbsent(t, e.d, ps.Name, po.Name)
	harness.AssertNoLeaks(t, e.d.Root, harness.WantImages(t, harness.BusyboxImage(t, harness.ImageSpec{})))
}
