package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	db, err := bolt.Open(dbPath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("leases")) // the image package's lease bucket
		v := b.Get([]byte(from))
		if v == nil {
			t.Fatalf("container %s holds no lease", from)
		}
		return b.Put([]byte(to), v)
	}); err != nil {
		t.Fatal(err)
	}
}
