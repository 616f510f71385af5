package sandbox

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/berth-runtime/berth/sandbox/store"
)

// TestLayerDirFollowsTheRecord: a writable layer is found under the root
// its container was made with, whatever the container root is now; a
// record from before container roots (none recorded) has it under Root.
func TestLayerDirFollowsTheRecord(t *testing.T) {
	m := &Manager{opts: Options{Root: "/var/lib/berth", ContainerRoot: "/disk2/berth"}}
	for _, c := range []struct {
		record string
		want   string
	}{
		{`{"id":"a"}`, "/var/lib/berth/containers/a"},
		{`{"id":"b","layerRoot":"/disk2/berth"}`, "/disk2/berth/containers/b"},
		{`{"id":"c","layerRoot":"/old/disk"}`, "/old/disk/containers/c"},
	} {
		var ctr store.Container
		if err := json.Unmarshal([]byte(c.record), &ctr); err != nil {
			t.Fatal(err)
		}
		if got := m.layerDir(&ctr); got != c.want {
			t.Errorf("layerDir of %s = %s, want %s", c.record, got, c.want)
		}
	}
	if got, want := m.layerRoots(), []string{"/disk2/berth", "/var/lib/berth"}; !slices.Equal(got, want) {
		t.Errorf("layerRoots = %v, want %v", got, want)
	}
	m.opts.ContainerRoot = m.opts.Root
	if got := m.layerRoots(); !slices.Equal(got, []string{"/var/lib/berth"}) {
		t.Errorf("layerRoots with one root = %v, want it once", got)
	}
}
