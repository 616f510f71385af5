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
	usage := func() *runtimeapi.FilesystemUsage {
		resp, err := e.d.Runtime.ContainerStats(t.Context(), &runtimeapi.ContainerStatsRequest{ContainerId: ctr})
		if err != nil {
			t.Fatalf("ContainerStats: %v", err)
		}
		return resp.Stats.WritableLayer
	}
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
