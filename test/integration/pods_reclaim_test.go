package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	bolt "go.etcd.io/bbolt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestRecoveryReclaimsUnknown plants what a crash at the wrong moment
// leaves without a record — a pod folder with a shm mount and a mounted
// bundle, a mounted bundle in a live pod, a writable layer, an image lease
// of no container — and restarts berthd: all of it is gone, the live pod
// and its container are untouched, and once they and the image are
// removed not one snapshot stays (the orphan lease held none).
func TestRecoveryReclaimsUnknown(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("reclaim")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("keeper", sleeper...))
	e.d.Kill()

	ghostPod, ghostCtr, ghostLayer, ghostLease := strings.Repeat("a", 64), strings.Repeat("c", 64), strings.Repeat("b", 64), strings.Repeat("d", 64)
	pods := filepath.Join(e.d.State, "pods")
	planted := []string{
		filepath.Join(pods, ghostPod),
		filepath.Join(pods, pod, "containers", ghostCtr),
		filepath.Join(e.d.Root, "containers", ghostLayer),
	}
	for _, d := range []string{
		filepath.Join(pods, ghostPod, "shm"),
		filepath.Join(pods, ghostPod, "containers", ghostCtr, "rootfs"),
		filepath.Join(pods, pod, "containers", ghostCtr, "rootfs"),
		filepath.Join(e.d.Root, "containers", ghostLayer, "upper"),
	} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(d, e.d.Root) {
			mustMount(t, "tmpfs", d, "tmpfs", 0)
		}
	}
	copyLease(t, filepath.Join(e.d.Root, "meta.db"), ctr, ghostLease)

	e.d.Restart()
	for _, p := range planted {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the restart (%v)", p, err)
		}
	}
	for _, id := range []string{ghostPod, ghostCtr} {
		if ms := mountsMentioning(id); len(ms) != 0 {
			t.Errorf("mounts left: %v", ms)
		}
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	e.sh(t, ctr, "true")

	e.removePod(t, pod)
	removeImage(t, e.d, e.image)
	e.assertNoLeaks(t)
	harness.AssertNoLeaks(t, e.d.Root, harness.WantSnapshots(0))
}

// copyLease gives owner `to` the image lease of owner `from` in berthd's
// database (berthd must not run).
func copyLease(t *testing.T, dbPath, from, to string) {
	t.Helper()
	updateDB(t, dbPath, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("leases")) // the image package's lease bucket
		v := b.Get([]byte(from))
		if v == nil {
			t.Fatalf("container %s holds no lease", from)
		}
		return b.Put([]byte(to), v)
	})
}

// updateDB changes berthd's database (berthd must not run).
func updateDB(t *testing.T, dbPath string, change func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(dbPath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(change); err != nil {
		t.Fatal(err)
	}
}

// TestStartupIsNotAllOrNothing restarts berthd with a pod whose shim
// accepts but never answers (stopped with SIGSTOP) and a network whose
// state cannot be read: berthd serves anyway, reports NetworkReady=false
// with the cause, refuses new pods cleanly, and keeps the existing one; once
// the causes are gone, all works again without a restart.
func TestStartupIsNotAllOrNothing(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("wedged")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("patient", sleeper...))
	shimPID := e.shimPID(t, pod)
	e.d.Kill()

	leases := filepath.Join(e.d.Root, "network", "leases")
	if err := os.Rename(leases, leases+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(leases, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(shimPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(shimPID, syscall.SIGCONT) })

	e.d.Restart() // fails t unless berthd serves within the harness's start timeout
	if c := e.networkReady(t); c.Status || !strings.Contains(c.Message, "leases") {
		t.Errorf("NetworkReady = %v %q %q, want false naming the leases", c.Status, c.Reason, c.Message)
	}
	if _, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: e.podConfig("refused")}); err == nil {
		t.Error("RunPodSandbox succeeded on a network that is not ready")
	}

	if err := syscall.Kill(shimPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(leases); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(leases+".away", leases); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	if st := e.podStatus(t, pod).State; st != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("the wedged shim's pod is %v, want READY", st)
	}
	cfg2 := e.podConfig("after")
	pod2 := e.runPod(t, cfg2)
	if c := e.networkReady(t); !c.Status {
		t.Errorf("NetworkReady = false %q after a pod was attached", c.Message)
	}

	e.removePod(t, pod2)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestCancelledCreateLeavesNothing gives CreateContainer deadlines that end
// while the shim creates the container: whatever each call returns, the
// container then either exists for berthd or not at all, and the pod's
// removal (whose shim refuses to quit while it holds a container) leaves
// nothing behind.
func TestCancelledCreateLeavesNothing(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("cancelled")
	pod := e.runPod(t, cfg)
	for i, d := range []time.Duration{10, 15, 20, 25, 30, 35, 40, 45, 50, 60} {
		ctx, cancel := context.WithTimeout(t.Context(), d*time.Millisecond)
		_, err := e.d.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg,
			Config: e.ctrConfig(fmt.Sprint("c", i), sleeper...)})
		cancel()
		t.Logf("deadline %v: %v", d*time.Millisecond, err)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestRecoveryKillsUnknownContainers: a container its pod's shim runs but
// berthd has no record of (its create's record lost in a crash) is killed
// and deleted in the shim when berthd starts, and its leftovers go with
// it; the pod and its other container are untouched.
func TestRecoveryKillsUnknownContainers(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("unknown-ctr")
	pod := e.runPod(t, cfg)
	keeper := e.runContainer(t, pod, cfg, e.ctrConfig("keeper", sleeper...))
	lost := e.runContainer(t, pod, cfg, e.ctrConfig("lost", sleeper...))
	lostPID := e.ctrPID(t, lost)
	e.d.Kill()
	forgetContainer(t, filepath.Join(e.d.Root, "meta.db"), lost)

	e.d.Restart()
	if !eventually(10*time.Second, func() bool { return !alive(lostPID) }) {
		t.Errorf("the container without a record still runs (pid %d)", lostPID)
	}
	if ids := e.listContainerIDs(t, nil); len(ids) != 1 || ids[0] != keeper {
		t.Errorf("containers listed after the restart: %v, want only %s", ids, keeper)
	}
	e.waitState(t, keeper, runtimeapi.ContainerState_CONTAINER_RUNNING)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// forgetContainer deletes a container's record from berthd's database
// (berthd must not run).
func forgetContainer(t *testing.T, dbPath, id string) {
	t.Helper()
	updateDB(t, dbPath, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("containers")) // the sandbox package's container bucket
		if b.Get([]byte(id)) == nil {
			t.Fatalf("no record of container %s", id)
		}
		return b.Delete([]byte(id))
	})
}
