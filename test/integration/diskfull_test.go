package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestDiskFull runs berthd on a 16 MiB ext4 filesystem on a loop device, as
// a node's small disk: a pull that does not fit and a container that fills
// its writable layer both fail with "no space left on device", leave nothing
// behind, and berthd keeps serving: once the space is free again, pulls and
// containers work.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	harness.RequireIntegration(t)
	root := t.TempDir()
	mountLoopExt4(t, root, 16<<20) // unmounted after the daemon stopped
	reg := harness.NewRegistry(t)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host()), Root: root})
	e := newPodEnv(t, d, reg)
	busybox := harness.BusyboxImage(t, harness.ImageSpec{})
	e.image = e.pushImage(t, "berth/busybox:pods", v1.Config{})

	random := make([]byte, 10<<20) // hex: 20 MiB unpacked, incompressible enough
	if _, err := rand.Read(random); err != nil {
		t.Fatal(err)
	}
	big := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("big", hex.EncodeToString(random), 0o644)}}})
	pb := reg.Push(t, "berth/big:1", big)
	// The node's lack of space, not the caller's mistake nor berth's fault.
	if _, err := pull(t, d, pb.Name, nil); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("pull of 20 MiB onto a 16 MiB root = %v; want ResourceExhausted, no space left on device", err)
	}
	assertAbsent(t, d, pb.Name, pb.ID)
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, busybox))

	podCfg := e.podConfig("fill")
	pod := e.runPod(t, podCfg)
	st, _ := e.runToExit(t, pod, podCfg, e.ctrConfig("fill", "/bin/sh", "-c",
		"busybox dd if=/dev/zero of=/fill bs=1M count=64; echo status=$? >&2; exit 3"))
	if st.ExitCode != 3 {
		t.Fatalf("the filling container exited %d: %s", st.ExitCode, st.Message)
	}
	// dd names the error (head, for one, says "I/O error" whatever it was).
	if log := logText(readLog(t, st.LogPath), "stderr"); strings.Contains(log, "status=0") ||
		!strings.Contains(log, "No space left on device") {
		t.Errorf("the container's write did not fail for lack of space: %q", log)
	}
	// berthd still answers while the root is full.
	if _, err := d.Runtime.Version(ctx(t), &runtimeapi.VersionRequest{}); err != nil {
		t.Errorf("Version on a full root: %v", err)
	}
	if imgs := listImages(t, d, ""); len(imgs) != 1 {
		t.Errorf("ListImages on a full root: %d images, want 1", len(imgs))
	}
	e.removePod(t, pod)

	// The space is back: a container runs, a pull that fits succeeds.
	pod = e.runPod(t, podCfg)
	if st, out := e.runToExit(t, pod, podCfg, e.ctrConfig("after", "/bin/echo", "ok")); st.ExitCode != 0 || out != "ok\n" {
		t.Errorf("a container after the disk was full: exit %d, output %q", st.ExitCode, out)
	}
	e.removePod(t, pod)
	small := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("small", "fits", 0o644)}}})
	ps := reg.Push(t, "berth/small:1", small)
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	if _, err := d.Images.PullImage(c, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ps.Name}}); err != nil {
		t.Errorf("a pull that fits, after the disk was full: %v", err)
	}
	e.assertNoLeaks(t)
}

// mountLoopExt4 mounts on dir (mode 0711) a fresh ext4 filesystem of size
// bytes, made in an image file and attached to a free loop device. The device
// is attached with autoclear: the kernel detaches it when the filesystem is
// unmounted, so only the mount can leak, and the cleanup, which runs after
// anything registered later (the daemon), unmounts it and fails t if the
// mount or the device stays behind.
//
// The loop device is set up with ioctls, not losetup: the host tier has
// util-linux's losetup, the VM tier only busybox's, and LOOP_CONFIGURE
// attaches and sets autoclear in one step, so that the device is never left
// attached without a mount holding it. mkfs.ext4 is e2fsprogs', which
// test/vm/run.sh copies into the VM.
func mountLoopExt4(t *testing.T, dir string, size int64) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.ext4")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", img, err, out)
	}
	loop, dev := attachLoop(t, img)
	err := unix.Mount(dev, dir, "ext4", 0, "")
	loop.Close() // from now on the mount holds the device; or, unmounted, detaches it
	if err != nil {
		t.Fatalf("mount %s (%s) on %s: %v", dev, img, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount berthd's root %s: %v (something under it is still in use)", dir, err)
			unix.Unmount(dir, unix.MNT_DETACH)
			return
		}
		assertLoopDetached(t, dev, img)
	})
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
}

// attachLoop attaches img to a free loop device, with autoclear, and returns
// the device open and its path. Other processes on the node pick free devices
// too: a device taken between LOOP_CTL_GET_FREE and LOOP_CONFIGURE (EBUSY)
// means asking again.
func attachLoop(t *testing.T, img string) (*os.File, string) {
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() // the loop device holds its own reference
	for range 10 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Fatalf("LOOP_CTL_GET_FREE: %v", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		loop, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd()), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if err == nil {
			return loop, dev
		}
		loop.Close()
		if err != unix.EBUSY {
			t.Fatalf("LOOP_CONFIGURE %s with %s: %v", dev, img, err)
		}
	}
	t.Fatalf("no free loop device for %s after 10 tries", img)
	return nil, ""
}

// assertLoopDetached fails t unless dev no longer has img as its backing
// file (another process may have attached something else to it since).
func assertLoopDetached(t *testing.T, dev, img string) {
	t.Helper()
	backing := filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file")
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(backing)
		if err != nil || !strings.HasPrefix(string(b), img) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s is still attached to %s after unmounting it", dev, img)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
