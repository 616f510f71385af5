package integration

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// The annotations that mark a checkpoint image: CRI-O's, on the manifest
// (what `buildah` sets for `kubectl` users, after CRI-O's docs), and
// checkpointctl's, which containerd looks for.
const crioCheckpointAnnotation, criuCheckpointAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name", "org.criu.checkpoint.container.name"

// checkpointImage is the OCI image of a checkpoint archive, as CRI-O's and
// containerd's users build it: one layer, the archive, and the annotation.
func checkpointImage(t *testing.T, archive, container string) v1.Image {
	t.Helper()
	layer, err := tarball.LayerFromFile(archive, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(harness.NewImage(t, harness.ImageSpec{}), layer)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.Annotations(img, map[string]string{crioCheckpointAnnotation: container}).(v1.Image)
}

// replaceInTar copies the tar src to dst with the content of the file
// name replaced.
func replaceInTar(t *testing.T, src, dst, name string, content []byte) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	found := false
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var body io.Reader = tr
		if hdr.Name == name {
			found, hdr.Size, body = true, int64(len(content)), bytes.NewReader(content)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil || !found {
		t.Fatalf("rewrite %s in %s: %v (found: %v)", name, src, err, found)
	}
}

// TestRestoreContainer: a container checkpointed with a counter, a TCP
// listener and layer changes comes back, from the OCI image of its archive
// pushed to a registry and pulled, in another pod: its counter goes on from
// where it was, its listener answers in the new pod's network namespace,
// its files are there. An image of the archive with CRIU's images broken
// fails StartContainer, naming CRIU's reason, with no process or cgroup
// left; removed, nothing of it is left.
func TestRestoreContainer(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	podCfg := e.podConfig("ckpt")
	pod := e.runPod(t, podCfg)
	ctr := e.runContainer(t, pod, podCfg, e.ctrConfig("counter", "/bin/sh", "-c", counterScript))
	if !criuWorks(t) {
		_, err := e.d.Runtime.CheckpointContainer(t.Context(), &runtimeapi.CheckpointContainerRequest{
			ContainerId: ctr, Location: filepath.Join(t.TempDir(), "counter.tar")})
		assertCode(t, err, one(codes.FailedPrecondition), "criu")
		e.removePod(t, pod)
		e.assertNoLeaks(t)
		return
	}
	// A count well past what a counter started afresh reaches before the
	// test reads it.
	if !eventually(60*time.Second, func() bool { return e.counter(t, ctr) >= 25 }) {
		t.Fatal("the counter does not reach 25")
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "counter.tar")
	if _, err := e.d.Runtime.CheckpointContainer(t.Context(), &runtimeapi.CheckpointContainerRequest{ContainerId: ctr, Location: archive}); err != nil {
		t.Fatalf("CheckpointContainer: %v", err)
	}
	before := e.counter(t, ctr)
	e.removePod(t, pod)

	pushed := e.reg.Push(t, "berth/counter:checkpoint", checkpointImage(t, archive, "counter"))
	mustPull(t, e.d, pushed.Name, pushed.ID)
	newCfg := e.podConfig("restored")
	newPod := e.runPod(t, newCfg)
	cfg := e.ctrConfig("counter", "/bin/false")
	cfg.Image.Image = pushed.Name
	restored := e.runContainer(t, newPod, newCfg, cfg)
	if n := e.counter(t, restored); n < 25 {
		t.Errorf("the restored counter is at %d, below the 25 it had passed before the checkpoint: it started afresh", n)
	}
	e.assertCounts(t, restored, "the restore")
	if got := e.exec(t, restored, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/").stdout; got != "served\n" {
		t.Errorf("the restored httpd answers %q in the new pod, want %q", got, "served\n")
	}
	if got := e.sh(t, restored, "cat /written-by-container; if test -e /etc/group; then echo group is back; fi"); got != "kept" {
		t.Errorf("the restored layer: %q, want the container's file and /etc/group deleted", got)
	}
	t.Logf("counter at the checkpoint: about %d", before)

	// CRIU's process tree image broken: the create stands, the start
	// fails with CRIU's reason, and nothing runs.
	broken := filepath.Join(dir, "broken.tar")
	replaceInTar(t, archive, broken, "checkpoint/pstree.img", []byte("not a CRIU image"))
	bad := e.reg.Push(t, "berth/counter:broken", checkpointImage(t, broken, "counter"))
	mustPull(t, e.d, bad.Name, bad.ID)
	cfg = e.ctrConfig("broken", "/bin/false")
	cfg.Image.Image = bad.Name
	id := e.create(t, newPod, newCfg, cfg)
	_, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: id})
	assertCode(t, err, one(codes.FailedPrecondition), "criu")
	if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", e.podCgroup(t, newPod), "*"+id+"*")); len(m) != 0 {
		t.Errorf("the failed restore left its cgroup: %v", m)
	}
	if processRuns(id) {
		t.Errorf("a process of the failed restore %s runs", id)
	}
	if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Errorf("RemoveContainer of the failed restore: %v", err)
	}
	e.removePod(t, newPod)
	e.assertNoLeaks(t)
}

// TestRestoreRefused: checkpoint images berth cannot restore from, marked
// as CRI-O marks them (the manifest's annotation) or as containerd looks
// for them (checkpointctl's, on the index), are refused at
// CreateContainer, naming the annotation and what is wrong, with nothing
// made: one with no archive in it, one whose container's image is not on
// the node.
func TestRestoreRefused(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	base := harness.BusyboxImage(t, harness.ImageSpec{})
	byCRIO := e.reg.Push(t, "berth/ckpt:crio", mutate.Annotations(base, map[string]string{crioCheckpointAnnotation: "counter"}).(v1.Image))
	idx := harness.Index(t, harness.OCI, base)
	byIndex := e.reg.PushIndex(t, "berth/ckpt:index", mutate.Annotations(idx, map[string]string{criuCheckpointAnnotation: "counter"}).(v1.ImageIndex))
	// An archive of a container of an image the node has not pulled.
	files := []harness.File{
		{Path: "config.dump", Content: []byte(`{"id":"c0","name":"counter","rootfsImageName":"127.0.0.1:1/not/pulled:1","rootfsImageRef":"sha256:` + strings.Repeat("0", 64) + `"}`)},
		{Path: "spec.dump", Content: []byte(`{"ociVersion":"1.0.0","process":{"args":["/bin/sh"],"cwd":"/"}}`)},
		{Path: "checkpoint", Type: tar.TypeDir},
		{Path: "checkpoint/inventory.img", Content: []byte("inventory")},
	}
	noImage := e.reg.Push(t, "berth/ckpt:no-image", mutate.Annotations(harness.NewImage(t, harness.ImageSpec{Layers: [][]harness.File{files}}),
		map[string]string{crioCheckpointAnnotation: "counter"}).(v1.Image))

	podCfg := e.podConfig("ckpt-image")
	pod := e.runPod(t, podCfg)
	for _, c := range []struct {
		pushed harness.Pushed
		want   []string
	}{
		{byCRIO, []string{crioCheckpointAnnotation, "config.dump"}},
		{byIndex, []string{criuCheckpointAnnotation, "config.dump"}},
		{noImage, []string{"127.0.0.1:1/not/pulled:1", "pull it first"}},
	} {
		mustPull(t, e.d, c.pushed.Name, c.pushed.ID)
		cfg := e.ctrConfig("restored", "/bin/sleep", "100000")
		cfg.Image.Image = c.pushed.Name
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
		assertCode(t, err, one(codes.FailedPrecondition), c.want...)
	}
	if ctrs, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{}); err != nil || len(ctrs.Containers) != 0 {
		t.Errorf("after the refusals: %v containers (%v), want none", len(ctrs.GetContainers()), err)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
