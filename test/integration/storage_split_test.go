package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestStorageSplit runs berthd with its root (the image store) and
// [storage] container_root (the writable layers) on two loop-device ext4
// filesystems, as a node with a separate disk for containers
// (KubeletSeparateDiskGC): ImageFsInfo reports each with its mount point,
// a pull takes space on the image filesystem only, a container's writes
// take it on the container filesystem only (ImageFsInfo's container
// filesystem and the container's stats say so; the image filesystem does
// not move), and after a restart with container_root unset again the
// container is still found, on the filesystem it was made on, and its
// removal frees that one.
func TestStorageSplit(t *testing.T) {
	t.Parallel()
	harness.RequireIntegration(t)
	base := t.TempDir()
	imageRoot, ctrRoot := filepath.Join(base, "images"), filepath.Join(base, "containers")
	for _, dir := range []string{imageRoot, ctrRoot} {
		if err := os.Mkdir(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		mountLoopExt4(t, dir, 64<<20) // unmounted after the daemon stopped
	}
	reg := harness.NewRegistry(t)
	split := fmt.Sprintf("\n[storage]\ncontainer_root = %q\n", ctrRoot)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host()) + split, Root: imageRoot})
	e := newPodEnv(t, d, reg)

	if got := verboseContainerRoot(t, d); got != ctrRoot {
		t.Errorf("verbose Status: containerRoot %q, want %q", got, ctrRoot)
	}
	empty := fsInfo(t, d, imageRoot, ctrRoot)
	if n := empty.ctr.GetUsedBytes().GetValue(); n != 0 {
		t.Errorf("container filesystem with no containers: %d bytes used, want 0", n)
	}
	freeImg, freeCtr := freeBytes(t, imageRoot), freeBytes(t, ctrRoot)

	// A pull: the image filesystem fills, the container filesystem does not.
	e.image = e.pushImage(t, "berth/busybox:split", v1.Config{})
	pulled := fsInfo(t, d, imageRoot, ctrRoot)
	if pulled.img.GetUsedBytes().GetValue() <= empty.img.GetUsedBytes().GetValue() {
		t.Errorf("image filesystem used %d bytes before the pull, %d after; want more",
			empty.img.GetUsedBytes().GetValue(), pulled.img.GetUsedBytes().GetValue())
	}
	if drop := freeImg - freeBytes(t, imageRoot); drop < 512<<10 {
		t.Errorf("the image filesystem's free space fell by %d bytes with the pull, want the image's (~1 MiB)", drop)
	}
	if moved := absDiff(freeCtr, freeBytes(t, ctrRoot)); moved > 256<<10 {
		t.Errorf("the container filesystem's free space moved by %d bytes with a pull", moved)
	}

	// A container writes 8 MiB into its writable layer.
	podCfg := e.podConfig("split")
	pod := e.runPod(t, podCfg)
	ctr := e.runContainer(t, pod, podCfg, e.ctrConfig("writer", sleeper...))
	freeImg, freeCtr = freeBytes(t, imageRoot), freeBytes(t, ctrRoot)
	e.sh(t, ctr, "busybox dd if=/dev/urandom of=/fill bs=1M count=8 2>/dev/null")
	const wrote = 8 << 20
	if drop := freeCtr - freeBytes(t, ctrRoot); drop < wrote {
		t.Errorf("the container filesystem's free space fell by %d bytes, want >= %d written", drop, wrote)
	}
	if moved := absDiff(freeImg, freeBytes(t, imageRoot)); moved > 1<<20 {
		t.Errorf("the image filesystem's free space moved by %d bytes with a container's write", moved)
	}
	if _, err := os.Stat(filepath.Join(ctrRoot, "containers", ctr, "upper", "fill")); err != nil {
		t.Errorf("the written file is not in the writable layer under container_root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(imageRoot, "containers", ctr)); !os.IsNotExist(err) {
		t.Errorf("a writable layer folder under root too: %v", err)
	}
	written := waitFsInfo(t, d, imageRoot, ctrRoot, "the container filesystem to count the write", func(u fsUsages) bool {
		return u.ctr.GetUsedBytes().GetValue() >= wrote
	})
	if a, b := pulled.img.GetUsedBytes().GetValue(), written.img.GetUsedBytes().GetValue(); a != b {
		t.Errorf("image filesystem used %d bytes before the container's write, %d after; want unchanged", a, b)
	}
	waitWritableLayer(t, d, ctr, ctrRoot, wrote)

	// Restart with container_root unset (root, the default): the container,
	// made under the old container root, is still found there.
	if err := os.WriteFile(d.Config, []byte(harness.PlainHTTP(reg.Host())), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Restart()
	if st := e.status(t, ctr); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after the restart the container is %v, want running", st.State)
	}
	waitWritableLayer(t, d, ctr, ctrRoot, wrote)
	if got := e.sh(t, ctr, "busybox wc -c < /fill"); got != fmt.Sprint(wrote) {
		t.Errorf("after the restart /fill has %s bytes, want %d", got, wrote)
	}
	e.removePod(t, pod)
	if entries, err := os.ReadDir(filepath.Join(ctrRoot, "containers")); err != nil || len(entries) != 0 {
		t.Errorf("writable layers left under the old container root: %v, %v", entries, err)
	}
	if moved := absDiff(freeCtr, freeBytes(t, ctrRoot)); moved > 1<<20 {
		t.Errorf("the container filesystem's free space is %d bytes off what it was before the write, after the removal", moved)
	}
	e.assertNoLeaks(t)
}

// TestStorageOneFilesystem: without [storage] container_root the writable
// layers stay under root, as on nodes from before the key, and ImageFsInfo
// still reports both filesystems, with one mount point (the kubelet then
// sees no split), the container filesystem counting a container's writes
// and the image filesystem not.
func TestStorageOneFilesystem(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	mount, err := filepath.EvalSymlinks(e.d.Root)
	if err != nil {
		t.Fatal(err)
	}
	for mount != "/" && !isMountPoint(t, mount) {
		mount = filepath.Dir(mount)
	}
	before := fsInfo(t, e.d, mount, mount)
	podCfg := e.podConfig("onefs")
	pod := e.runPod(t, podCfg)
	ctr := e.runContainer(t, pod, podCfg, e.ctrConfig("writer", sleeper...))
	e.sh(t, ctr, "busybox dd if=/dev/zero of=/fill bs=1M count=4 2>/dev/null")
	if _, err := os.Stat(filepath.Join(e.d.Root, "containers", ctr, "upper", "fill")); err != nil {
		t.Errorf("the written file is not in the writable layer under root: %v", err)
	}
	const wrote = 4 << 20
	written := waitFsInfo(t, e.d, mount, mount, "the container filesystem to count the write", func(u fsUsages) bool {
		return u.ctr.GetUsedBytes().GetValue() >= wrote
	})
	if a, b := before.img.GetUsedBytes().GetValue(), written.img.GetUsedBytes().GetValue(); a != b {
		t.Errorf("image filesystem used %d bytes before the container's write, %d after; want unchanged", a, b)
	}
	waitWritableLayer(t, e.d, ctr, mount, wrote)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// isMountPoint says whether dir is the root of a mount: its parent is on
// another device (the test's roots are not bind mounts).
func isMountPoint(t *testing.T, dir string) bool {
	t.Helper()
	var st, up unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Dir(dir), &up); err != nil {
		t.Fatal(err)
	}
	return st.Dev != up.Dev
}

// verboseContainerRoot is the container root verbose Status (crictl info)
// shows.
func verboseContainerRoot(t *testing.T, d *harness.Daemon) string {
	t.Helper()
	resp, err := d.Runtime.Status(ctx(t), &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ContainerRoot string `json:"containerRoot"`
	}
	if err := json.Unmarshal([]byte(resp.Info["config"]), &cfg); err != nil {
		t.Fatalf("verbose Status config %q: %v", resp.Info["config"], err)
	}
	return cfg.ContainerRoot
}

// fsUsages is one ImageFsInfo answer's image and container filesystem.
type fsUsages struct{ img, ctr *runtimeapi.FilesystemUsage }

// fsInfo asks ImageFsInfo and checks that it reports one image filesystem
// mounted at imageMount and one container filesystem mounted at ctrMount,
// each with a timestamp and both figures.
func fsInfo(t *testing.T, d *harness.Daemon, imageMount, ctrMount string) fsUsages {
	t.Helper()
	resp, err := d.Images.ImageFsInfo(ctx(t), &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ImageFilesystems) != 1 || len(resp.ContainerFilesystems) != 1 {
		t.Fatalf("ImageFsInfo: %d image and %d container filesystems, want 1 each", len(resp.ImageFilesystems), len(resp.ContainerFilesystems))
	}
	u := fsUsages{resp.ImageFilesystems[0], resp.ContainerFilesystems[0]}
	for _, f := range []struct {
		name, mount string
		u           *runtimeapi.FilesystemUsage
	}{{"image", imageMount, u.img}, {"container", ctrMount, u.ctr}} {
		if mp := f.u.GetFsId().GetMountpoint(); mp != f.mount {
			t.Errorf("%s filesystem mount point %q, want %q", f.name, mp, f.mount)
		}
		if f.u.Timestamp == 0 || f.u.UsedBytes == nil || f.u.InodesUsed == nil {
			t.Errorf("%s filesystem lacks timestamp, used bytes or inodes: %v", f.name, f.u)
		}
	}
	return u
}

// waitFsInfo polls fsInfo until ok: a writable layer's figures are walked
// in the background, at most 10 s old.
func waitFsInfo(t *testing.T, d *harness.Daemon, imageMount, ctrMount, what string, ok func(fsUsages) bool) fsUsages {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		u := fsInfo(t, d, imageMount, ctrMount)
		if ok(u) {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %s: image %v, container %v", what, u.img, u.ctr)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitWritableLayer polls ContainerStats until ctr's writable layer counts
// at least bytes, and checks that it is on the filesystem mounted at mount.
func waitWritableLayer(t *testing.T, d *harness.Daemon, ctr, mount string, bytes uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := d.Runtime.ContainerStats(ctx(t), &runtimeapi.ContainerStatsRequest{ContainerId: ctr})
		if err != nil {
			t.Fatal(err)
		}
		l := resp.GetStats().GetWritableLayer()
		if mp := l.GetFsId().GetMountpoint(); mp != mount {
			t.Fatalf("writable layer on %q, want the container filesystem %q", mp, mount)
		}
		if l.GetUsedBytes().GetValue() >= bytes {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for the writable layer to count %d bytes: %v", bytes, l)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// freeBytes is the free space of the filesystem holding dir.
func freeBytes(t *testing.T, dir string) uint64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bfree * uint64(st.Bsize)
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}
