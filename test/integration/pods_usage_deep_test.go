package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestWritableLayerUsageDeeperThanPathMax: a container that nests folders
// deeper than PATH_MAX, with a big file at the bottom, still has that file
// in its writable layer's figures (issue #21, finding 4: a walk by path
// failed with ENAMETOOLONG from then on, the figures froze, and the
// kubelet never evicted the container while the node's disk filled).
func TestWritableLayerUsageDeeperThanPathMax(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("deepusage")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("deep", sleeper...))
	usage := func() *runtimeapi.FilesystemUsage { return e.writableLayer(t, ctr) }
	// Figures of the layer before the chain: what a walk that fails keeps.
	usage()

	// Built bottom up, each step a rename of the chain into a new folder,
	// so that no path the shell or mv uses is long: 100 levels of 51 bytes
	// are 5100 bytes, past PATH_MAX (4096).
	name := strings.Repeat("d", 50)
	const levels, fileMiB = 100, 4
	script := fmt.Sprintf("set -e; cd /tmp; mkdir chain; dd if=/dev/zero of=chain/big bs=1048576 count=%d 2>/dev/null; "+
		"i=0; while [ $i -lt %d ]; do mkdir wrap; mv chain wrap/%s; mv wrap chain; i=$((i+1)); done", fileMiB, levels, name)
	if r := e.execWithin(t, ctr, 120, "/bin/sh", "-c", script); r.code != 0 {
		t.Fatalf("build the chain: exit %d: %s", r.code, r.stderr)
	}

	// A stats call starts a walk once the figures are 10 s old; the next
	// call after it ends has the new ones.
	var got *runtimeapi.FilesystemUsage
	ok := eventually(30*time.Second, func() bool {
		got = usage()
		return got.GetUsedBytes().GetValue() >= fileMiB<<20 && got.GetInodesUsed().GetValue() > levels
	})
	if !ok {
		t.Errorf("writable layer = %d bytes, %d inodes; want at least the %d MiB file at the bottom of the chain and its %d folders",
			got.GetUsedBytes().GetValue(), got.GetInodesUsed().GetValue(), fileMiB, levels)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestWritableLayerUsageBehindLongNames: a container that nests folders
// each full of 255-byte names, more than one walk holds at once on its
// path (16 MiB), and then writes a big file at the bottom still has the
// whole chain and the file in its writable layer's figures (the walk used
// to stop at its bound, so that what lay below went uncounted and the
// container escaped ephemeral-storage eviction).
func TestWritableLayerUsageBehindLongNames(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("longnames")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("hostile", sleeper...))
	usage := func() *runtimeapi.FilesystemUsage { return e.writableLayer(t, ctr) }
	usage()

	// 116 names of 255 bytes fill one 32 KiB read of a folder's names; the
	// next folder, named after its level so that it falls anywhere among
	// them in hash order (ext4), is read in the middle on average: a walk
	// holding what it has not visited holds some 16 KiB a level, 16 MiB at
	// about 1000 levels. Built bottom up, each level a rename of the chain
	// into a new folder, so that no path the shell uses is long.
	const levels, perLevel, fileMiB = 1400, 116, 8
	// It prints the blocks of its folders and file as stat sees them: du,
	// which takes paths, cannot read a chain deeper than PATH_MAX.
	script := fmt.Sprintf("set -e; cd /tmp; mkdir chain; dd if=/dev/zero of=chain/big bs=1048576 count=%d 2>/dev/null; "+
		"b=$(( $(stat -c %%b chain) + $(stat -c %%b chain/big) )); "+
		"n=$(printf '%%250s' | tr ' ' n); set --; i=10000; while [ $i -lt %d ]; do set -- \"$@\" \"wrap/$i$n\"; i=$((i+1)); done; "+
		"l=0; while [ $l -lt %d ]; do mkdir wrap; touch \"$@\"; mv chain wrap/$l; b=$((b + $(stat -c %%b wrap))); mv wrap chain; l=$((l+1)); done; "+
		"echo $((b * 512))", fileMiB, 10000+perLevel, levels)
	r := e.execWithin(t, ctr, 600, "/bin/sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("build the chain: exit %d: %s", r.code, r.stderr)
	}
	var chainBytes uint64
	if _, err := fmt.Sscan(r.stdout, &chainBytes); err != nil || chainBytes < fileMiB<<20 {
		t.Fatalf("the chain's blocks: %q (%v)", r.stdout, err)
	}

	wantInodes := uint64(levels*(perLevel+1) + 2) // the names and folders, chain and big
	var got *runtimeapi.FilesystemUsage
	ok := eventually(60*time.Second, func() bool {
		got = usage()
		return got.GetUsedBytes().GetValue() >= chainBytes && got.GetInodesUsed().GetValue() >= wantInodes
	})
	if !ok {
		t.Errorf("writable layer = %d bytes, %d inodes; want at least the chain's %d bytes with its %d MiB file, and %d inodes",
			got.GetUsedBytes().GetValue(), got.GetInodesUsed().GetValue(), chainBytes, fileMiB, wantInodes)
	}
	t.Logf("writable layer = %d bytes, %d inodes; the chain's blocks %d bytes", got.GetUsedBytes().GetValue(), got.GetInodesUsed().GetValue(), chainBytes)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// writableLayer is the figures ContainerStats gives of ctr's writable layer.
func (e *podEnv) writableLayer(t *testing.T, ctr string) *runtimeapi.FilesystemUsage {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStats(t.Context(), &runtimeapi.ContainerStatsRequest{ContainerId: ctr})
	if err != nil {
		t.Fatalf("ContainerStats: %v", err)
	}
	return resp.Stats.WritableLayer
}
