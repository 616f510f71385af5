package kubelet

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageGCPod keeps the test image in use while the unused ones go.
const imageGCPod = `apiVersion: v1
kind: Pod
metadata:
  name: imagegc
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: keeper
    image: IMAGE
    command: ["sleep", "3600"]
`

const (
	imageFsSize = 192 << 20 // the loop filesystem under berthd's root
	fillerSize  = 16 << 20  // random (incompressible) data per unused image
	fillers     = 4
	// imageFsAvailableMin is the kubelet's imagefs.available eviction
	// threshold: below it the eviction manager runs the image GC at once.
	imageFsAvailableMin = 70 // percent
)

// The kubelet's periodic image GC (imageGCHighThresholdPercent) runs every
// 5 minutes (ImageGCPeriod, a constant), its first pass at start, before
// the stats it needs exist. Its other caller is the eviction manager
// (every 10 s): when the image filesystem falls below imagefs.available it
// deletes every unused image (DeleteUnusedImages) before it evicts any
// pod: the test fills the image filesystem past imagefs.available. Right
// after deleting, that pass still reads cadvisor's cached figures and logs
// that it must evict (static pods are critical: it evicts none); the next
// pass sees the space back. The GC thresholds are set too: the periodic
// pass would free down to the low mark on its next turn. A minimum GC age
// of 0 is taken as unset (2 minutes), hence 1s.
var imageGCConfig = fmt.Sprintf(`imageGCHighThresholdPercent: 40
imageGCLowThresholdPercent: 30
imageMinimumGCAge: 1s
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "%d%%"
  imagefs.inodesFree: "1%%"
`, imageFsAvailableMin)

// TestKubeletImageGC puts berthd's root (its image store) on a small ext4
// filesystem of its own, runs a pod, then pulls unused images until the
// image filesystem is over the kubelet's thresholds. The kubelet's image
// GC removes them through berth's RemoveImage: the unused images are
// gone, the pod's image stays and its container runs on, berth's
// ImageFsInfo falls back, and the kubelet's summary shows the space back.
// Had berth only dropped the records and not freed the space, ImageFsInfo
// would not fall and the summary's imageFs would stay under the threshold.
func TestKubeletImageGC(t *testing.T) {
	requireTier(t)
	for _, tool := range []string{"mkfs.ext4", "losetup", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	e := newEnvWith(t, imageGCConfig, func(b *kubeenv.Berthd) func() { return mountLoopExt4(t, b.Root, imageFsSize) })
	e.writeManifest("imagegc", imageGCPod)
	e.waitPod(t, "imagegc", 2*time.Minute, "keeper running", func(p *corev1.Pod) bool {
		c := ctrStatus(p, "keeper")
		return c != nil && c.State.Running != nil
	})
	fs := e.imageFs(t)
	if fs.GetFsId().GetMountpoint() != e.berthd.Root {
		t.Fatalf("ImageFsInfo's mountpoint is %q, want berthd's root %s", fs.GetFsId().GetMountpoint(), e.berthd.Root)
	}
	before := fs.GetUsedBytes().GetValue()

	// ImageFsInfo counts what a returned pull holds: right after each
	// pull, it counts every filler still stored. Not all four at the end:
	// once the fillers take the image filesystem past imagefs.available,
	// the eviction manager's next pass may remove the first ones while
	// the last are pulled (a loaded machine once saw one filler gone, its
	// layer, config and manifest, when the fourth pull returned).
	var unused []string
	var full uint64
	for i := range fillers {
		data := make([]byte, fillerSize)
		rand.New(rand.NewSource(int64(i) + 1)).Read(data)
		ref, _ := e.reg.PushBusybox(t, fmt.Sprintf("berth/filler:%d", i), kubeenv.File{Name: "filler", Mode: 0o644, Data: data})
		if _, err := e.img.PullImage(kubeenv.Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		unused = append(unused, ref)
		full = e.imageFs(t).GetUsedBytes().GetValue()
		// Listed after ImageFsInfo answered, so stored when it counted.
		stored := slices.DeleteFunc(e.imageTags(t), func(tag string) bool { return !slices.Contains(unused, tag) })
		if !slices.Contains(stored, ref) {
			t.Logf("filler %s was removed as soon as it was pulled", ref)
		}
		if want := before + uint64(len(stored))*fillerSize; full < want {
			t.Fatalf("ImageFsInfo used bytes %d right after pulling %s, want at least %d: the pod's image (%d) and the %d fillers stored (%v), %d bytes each",
				full, ref, want, before, len(stored), stored, fillerSize)
		}
	}
	t.Logf("image filesystem: %d MiB used with the pod's image, %d MiB after the %d fillers' pulls", before>>20, full>>20, fillers)

	start := time.Now()
	kubeenv.WaitFor(t, 90*time.Second, "the unused images gone from berth", func() (bool, string) {
		left := slices.DeleteFunc(e.imageTags(t), func(tag string) bool { return !slices.Contains(unused, tag) })
		avail, capacity, err := e.summaryImageFs()
		return len(left) == 0, fmt.Sprintf("still there: %v (the kubelet's imageFs: %d of %d bytes available, %v)", left, avail, capacity, err)
	})
	t.Logf("the kubelet's image GC removed them %s after the pulls", time.Since(start).Round(time.Second))

	tags := e.imageTags(t)
	if !slices.Contains(tags, e.image) {
		t.Errorf("the running pod's image %s was removed too (images left: %v)", e.image, tags)
	}
	// berth removes the layers and blobs of removed images in a GC of its
	// own, soon after the last RemoveImage.
	kubeenv.WaitFor(t, 30*time.Second, "berth's ImageFsInfo back to what the pod's image uses", func() (bool, string) {
		after := e.imageFs(t).GetUsedBytes().GetValue()
		return after <= before+fillerSize/2, fmt.Sprintf("used bytes: %d before the pulls, %d with them, %d now", before, full, after)
	})

	// The kubelet sees the space back: its summary's imageFs is over the
	// eviction threshold again, and it evicted nothing.
	kubeenv.WaitFor(t, 30*time.Second, "the kubelet's summary shows the image filesystem's space back", func() (bool, string) {
		avail, capacity, err := e.summaryImageFs()
		if err != nil {
			return false, err.Error()
		}
		return capacity > 0 && avail*100/capacity > imageFsAvailableMin,
			fmt.Sprintf("imageFs availableBytes %d of %d", avail, capacity)
	})
	p := e.waitPod(t, "imagegc", 10*time.Second, "keeper still running", func(p *corev1.Pod) bool {
		c := ctrStatus(p, "keeper")
		return c != nil && c.State.Running != nil
	})
	if c := ctrStatus(p, "keeper"); c.RestartCount != 0 {
		t.Errorf("keeper restarted %d times", c.RestartCount)
	}
	// It was the kubelet's image GC that removed them (through RemoveImage).
	log, err := os.ReadFile(e.kubelet.Log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "Removing image to free bytes"); n < fillers {
		t.Errorf("the kubelet's image GC logged %d removals, want %d", n, fillers)
	}
	e.removeManifest("imagegc")
	kubeenv.WaitFor(t, 2*time.Minute, "berth has no pod left", func() (bool, string) {
		n, err := e.berthPodCount()
		return err == nil && n == 0, fmt.Sprintf("%d pods, %v", n, err)
	})
}

// imageFs is berth's one image filesystem (ImageFsInfo).
func (e *env) imageFs(t *testing.T) *runtimeapi.FilesystemUsage {
	t.Helper()
	r, err := e.img.ImageFsInfo(kubeenv.Ctx(t), &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.ImageFilesystems) != 1 {
		t.Fatalf("ImageFsInfo: %d image filesystems, want 1", len(r.ImageFilesystems))
	}
	return r.ImageFilesystems[0]
}

// imageTags are the repo tags of berth's images (ListImages).
func (e *env) imageTags(t *testing.T) []string {
	t.Helper()
	r, err := e.img.ListImages(kubeenv.Ctx(t), &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, img := range r.Images {
		tags = append(tags, img.RepoTags...)
	}
	return tags
}

// summaryImageFs is node.runtime.imageFs of the kubelet's /stats/summary.
func (e *env) summaryImageFs() (avail, capacity uint64, err error) {
	body, err := kubeenv.Get(fmt.Sprintf("http://127.0.0.1:%d/stats/summary", e.readOnly))
	if err != nil {
		return 0, 0, err
	}
	var s struct {
		Node struct {
			Runtime struct {
				ImageFs struct {
					AvailableBytes uint64 `json:"availableBytes"`
					CapacityBytes  uint64 `json:"capacityBytes"`
				} `json:"imageFs"`
			} `json:"runtime"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		return 0, 0, err
	}
	return s.Node.Runtime.ImageFs.AvailableBytes, s.Node.Runtime.ImageFs.CapacityBytes, nil
}

// mountLoopExt4 mounts a fresh ext4 filesystem of size bytes (a sparse file
// on a loop device) on dir and returns what unmounts it and frees the
// device (the device is attached with autoclear: the unmount detaches it).
func mountLoopExt4(t *testing.T, dir string, size int64) func() {
	t.Helper()
	// Next to dir, in the run's folder: removed with it, after the unmount.
	img := filepath.Join(filepath.Dir(dir), "imagefs.ext4")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", img, err, out)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	// mount -o loop attaches a free device with autoclear.
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s on %s: %v: %s", img, dir, err, out)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("unmount berthd's root %s: %v: %s (something under it is still in use)", dir, err, out)
			exec.Command("umount", "-l", dir).Run()
		}
		if out, _ := exec.Command("losetup", "-j", img).Output(); len(out) > 0 {
			t.Errorf("loop device of %s still attached after the unmount: %s", img, out)
		}
	}
}
