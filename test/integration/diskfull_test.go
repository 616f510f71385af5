package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestDiskFull runs berthd on a 16 MiB tmpfs root: a pull that does not fit
// and a container that fills its writable layer both fail with "no space
// left on device" (or EIO, as overlayfs reports it on tmpfs), leave nothing behind, and berthd keeps serving: once the
// space is free again, pulls and containers work.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	harness.RequireIntegration(t)
	root := t.TempDir()
	if err := unix.Mount("berth-diskfull", root, "tmpfs", 0, "size=16m,mode=0711"); err != nil {
		t.Fatalf("mount a small tmpfs as berthd's root: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) }) // runs after the daemon stopped
	reg := harness.NewRegistry(t)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host()), Root: root})
	e := &podEnv{d: d, reg: reg, logs: t.TempDir(), parent: "berth-itest/" + filepath.Base(d.State)}
	t.Cleanup(func() { e.teardown(t) })
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
		"head -c 67108864 /dev/zero > /fill; echo status=$? >&2; exit 3"))
	if st.ExitCode != 3 {
		t.Fatalf("the filling container exited %d: %s", st.ExitCode, st.Message)
	}
	// overlayfs reports a full upper layer as ENOSPC or, on tmpfs, EIO.
	if log := logText(readLog(t, st.LogPath), "stderr"); strings.Contains(log, "status=0") ||
		!strings.Contains(log, "No space left on device") && !strings.Contains(log, "I/O error") {
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
