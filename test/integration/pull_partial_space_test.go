package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// onDisk is how many bytes the file at path holds on the disk: its size,
// less its holes (a partial download's parts are written at their
// offsets), as berthd counts them; 0 when it is not there.
func onDisk(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); errors.Is(err, fs.ErrNotExist) {
		return 0
	} else if err != nil {
		t.Fatal(err)
	}
	return min(st.Size, st.Blocks*512)
}

// imageStoreUsed is ImageFsInfo's used bytes of the image filesystem.
func imageStoreUsed(t *testing.T, d *harness.Daemon) int64 {
	t.Helper()
	resp, err := d.Images.ImageFsInfo(ctx(t), &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return int64(resp.ImageFilesystems[0].GetUsedBytes().GetValue())
}

// TestPullRefusesBlobOverMaxLayerBytes (#34, finding 5): a layer whose
// blob the manifest says is bigger than max_layer_bytes is refused before
// a byte of it is fetched or written. Before, a big layer at a registry
// that answers ranges had its parts written at their offsets ahead of the
// unpacker; with the first part stalled, the cut pull left a partial file
// of tens of MiB, several times the bound, for 24 h.
func TestPullRefusesBlobOverMaxLayerBytes(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	const maxLayerBytes = 8 << 20
	reg, px, d := startBehindProxy(t, "[image]\nmax_layer_bytes = 8388608\npull_progress_timeout = \"2s\"\n")
	// 66 files of 1 MiB: the unpacker, which counts the bytes of the files,
	// would refuse the layer only past 8 MiB of them.
	rng := rand.NewChaCha8([32]byte{5})
	var files []harness.File
	for i := range 66 {
		b := make([]byte, 1<<20)
		_, _ = rng.Read(b)
		files = append(files, harness.Reg(fmt.Sprint("random", i), string(b), 0o644))
	}
	img := harness.NewImage(t, harness.ImageSpec{Compression: harness.Uncompressed, Layers: [][]harness.File{files}})
	reg.Push(t, "berth/huge:1", img)
	ref := px.Host() + "/berth/huge:1"
	layer := harness.LayerDigests(t, img)[0]
	px.Stall(layer, 1<<20) // the first part stalls; the parts after it come at once
	px.Reset()

	_, err := pullWithin(t, d, ref, nil, time.Minute)
	assertCode(t, err, one(codes.FailedPrecondition), "layer too large", "max_layer_bytes")
	if n := onDisk(t, partialFile(d, layer)); n > maxLayerBytes {
		t.Errorf("the partial download holds %d bytes on the disk, more than max_layer_bytes (%d)", n, maxLayerBytes)
	}
	if gets := px.Gets(layer); len(gets) != 0 {
		t.Errorf("the layer over max_layer_bytes was fetched: %+v", gets)
	}
	assertAbsent(t, d, ref)
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

// TestPartialDownloadsCountedAndFreed (#34, finding 5): the bytes a cut
// pull keeps to resume are counted in ImageFsInfo, and an image removal
// (the kubelet's image GC) removes them, but not those of a pull still
// writing.
func TestPartialDownloadsCountedAndFreed(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	// 10 s without a byte ends a pull: the cut one below, never the live
	// one, whose bytes a loaded machine (make test's -race suite on 2
	// cores) once held back for 2 s.
	reg, px, d := startBehindProxy(t, harness.ImageTOML("10s"))
	small := reg.Push(t, "berth/small:1", harness.BusyboxImage(t, harness.ImageSpec{}))
	smallRef := px.Host() + "/berth/small:1"
	mustPull(t, d, smallRef, small.ID)

	cutRef, _, cutImg := randomLayers(t, reg, px, "berth/cut:1", 12<<20)
	cut := harness.LayerDigests(t, cutImg)[0]
	px.Stall(cut, harness.BlobSize(t, cutImg, cut)/2)
	before := imageStoreUsed(t, d)
	_, err := pullWithin(t, d, cutRef, nil, time.Minute)
	assertCode(t, err, []codes.Code{codes.DeadlineExceeded, codes.Unavailable, codes.Aborted}, "progress")
	kept := onDisk(t, partialFile(d, cut))
	if kept < 4<<20 {
		t.Fatalf("the cut pull kept %d bytes to resume, want about 6 MiB", kept)
	}
	if grew := imageStoreUsed(t, d) - before; grew < kept {
		t.Errorf("ImageFsInfo grew by %d bytes with a partial download of %d bytes on the disk", grew, kept)
	}

	// A pull that is still writing when an image is removed: slowed to
	// about 12 s, never 10 s without a byte.
	liveRef, live, liveImg := randomLayers(t, reg, px, "berth/live:1", 3<<20)
	liveLayer := harness.LayerDigests(t, liveImg)[0]
	px.LimitRate(256 << 10)
	liveDone := make(chan error, 1)
	go func() {
		id, err := pullWithin(t, d, liveRef, nil, time.Minute)
		if err == nil && id != live.ID {
			err = errors.New("image_ref " + id + ", want " + live.ID)
		}
		liveDone <- err
	}()
	if !eventually(30*time.Second, func() bool { return onDisk(t, partialFile(d, liveLayer)) > 0 }) {
		t.Fatal("the live pull wrote nothing in 30 s")
	}

	removeImage(t, d, smallRef)
	if !eventually(10*time.Second, func() bool {
		_, err := os.Stat(partialFile(d, cut))
		return errors.Is(err, fs.ErrNotExist)
	}) {
		t.Fatalf("the cut pull's partial download is still there 10 s after RemoveImage")
	}
	if _, err := os.Stat(partialFile(d, liveLayer)); err != nil {
		select {
		case err := <-liveDone: // it completed, which removes its file
			liveDone <- err
		default:
			t.Errorf("the partial download of a pull still writing was removed: %v", err)
		}
	}
	if err := <-liveDone; err != nil {
		t.Errorf("the pull that was writing during the removal: %v", err)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, liveImg))
}
