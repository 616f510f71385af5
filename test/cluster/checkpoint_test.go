package cluster

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
)

// crioCheckpointAnnotation marks an image as a checkpoint of the container
// it names, on its manifest: CRI-O's, which its users put there with
// buildah and berth reads.
const crioCheckpointAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name"

// counterCommand counts in /counter, five times a second.
const counterCommand = `["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i >/counter; sleep 0.2; done"]`

// counterPod is a pod of prod on the VM node whose container, app, runs
// counterCommand.
var counterPod = strings.Replace(vmPod("ckpt", "", false, "", "", ""), `["sleep", "36000"]`, counterCommand, 1)

// restoredPod is a pod of prod on the VM node whose container, app, is of
// the checkpoint image: its command, sleep, is not run (the archive's
// processes are restored), so a count in /counter is the restored one's.
func restoredPod(image string) string {
	return strings.Replace(vmPod("ckpt-restored", "", false, "", "", ""), "image: IMAGE", "image: "+image, 1)
}

// vmCounter is the count of pod's container now. The shell truncates
// /counter before it writes the next count, so a read can find it empty.
func (e *env) vmCounter(t *testing.T, pod string) int {
	t.Helper()
	var n int
	kubeenv.WaitFor(t, time.Minute, "the counter of "+pod, func() (bool, string) {
		out, err := e.kubectlErr("exec", "-n", prodNS, pod, "--", "cat", "/counter")
		if err == nil {
			n, err = strconv.Atoi(strings.TrimSpace(out))
		}
		return err == nil, fmt.Sprint(err)
	})
	return n
}

// vmCheckpoint: the kubelet's checkpoint API (ContainerCheckpoint, on by
// default), through the API server's node proxy as an admin calls it,
// has berth checkpoint a running counter: the answer names the archive,
// the archive is on the node under /var/lib/kubelet/checkpoints/ with
// CRIU's images and berth's files, and the container counts on, not
// restarted. Then the archive's image (one layer, the archive, and CRI-O's
// annotation), pushed to the tier's registry, restores the counter in a
// new pod on the same node: Running, counting on from past where it was.
func (e *env) vmCheckpoint(t *testing.T) {
	e.apply(t, counterPod)
	e.waitPod(t, prodNS, "ckpt", vmStartTimeout, "Running", running)
	// A count well past what a counter started afresh reaches before the
	// restored one is read.
	kubeenv.WaitFor(t, 2*time.Minute, "the counter of ckpt past 25", func() (bool, string) {
		n := e.vmCounter(t, "ckpt")
		return n >= 25, fmt.Sprint(n)
	})
	before := e.vmCounter(t, "ckpt")
	start := time.Now()
	// kubectl create --raw POSTs; the kubelet reads no body.
	answer, err := e.kubectlIn("{}", "create", "--raw", "/api/v1/nodes/"+e.vm.name+"/proxy/checkpoint/"+prodNS+"/ckpt/app?timeout=120", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the kubelet's checkpoint of ckpt/app after %s: %s", time.Since(start).Round(100*time.Millisecond), answer)
	var archives struct{ Items []string }
	if err := json.Unmarshal([]byte(answer), &archives); err != nil || len(archives.Items) != 1 ||
		!strings.HasPrefix(archives.Items[0], "/var/lib/kubelet/checkpoints/checkpoint-ckpt_prod-app-") {
		t.Fatalf("the kubelet's answer %q (%v), want one archive, /var/lib/kubelet/checkpoints/checkpoint-ckpt_prod-app-TIME.tar", answer, err)
	}
	archive := []byte(e.kubectl(t, "exec", "-n", prodNS, "cgprobe", "--", "cat", "/proc/1/root"+archives.Items[0]))
	names, config := archiveContents(t, archive)
	for _, want := range []string{"config.dump", "spec.dump", "rootfs-diff.tar", "checkpoint/inventory.img", "checkpoint/pstree.img"} {
		if !slices.Contains(names, want) {
			t.Errorf("the archive (%d bytes) has no %s: %v", len(archive), want, names)
		}
	}
	if config.Name != "app" || config.RootfsImageName != e.imageV1 {
		t.Errorf("the archive's config.dump: container %q of image %q, want app of %s", config.Name, config.RootfsImageName, e.imageV1)
	}
	if n := e.vmCounter(t, "ckpt"); n <= before {
		t.Errorf("the counter of ckpt is at %d after the checkpoint, was %d: the container does not run", n, before)
	}
	if p := e.pod(t, prodNS, "ckpt"); !running(p) || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("after the checkpoint: %s, want Running, never restarted", describe(p))
	}

	image, _ := e.reg.PushLayer(t, "berth/counter:checkpoint", archive, map[string]string{crioCheckpointAnnotation: "app"})
	e.apply(t, restoredPod(image))
	e.waitPod(t, prodNS, "ckpt-restored", vmStartTimeout, "Running", running)
	restored := e.vmCounter(t, "ckpt-restored")
	if restored < before {
		t.Errorf("the restored counter is at %d, below the %d it had passed before the checkpoint: it started afresh", restored, before)
	}
	kubeenv.WaitFor(t, time.Minute, "the restored counter counting", func() (bool, string) {
		n := e.vmCounter(t, "ckpt-restored")
		return n > restored, fmt.Sprintf("at %d, was %d", n, restored)
	})
	t.Logf("counter: %d before the checkpoint, %d once restored", before, restored)
	e.kubectl(t, "delete", "pod", "-n", prodNS, "ckpt", "ckpt-restored", "--wait=false")
}

// archiveContents is a checkpoint archive's names and its config.dump.
func archiveContents(t *testing.T, archive []byte) (names []string, config struct{ Name, RootfsImageName string }) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, config
		}
		if err != nil {
			t.Fatalf("the archive (%d bytes): %v", len(archive), err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
		names = append(names, name)
		if name == "config.dump" {
			if err := json.NewDecoder(tr).Decode(&config); err != nil {
				t.Fatalf("the archive's config.dump: %v", err)
			}
		}
	}
}
