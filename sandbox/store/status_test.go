package store

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/sandbox/shim"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestAppliedResourcesInvertSpecResources: the resources status shows are
// those the record's limits were made from, with the config's OOM score,
// and every status the view makes (ContainerStatus, PodSandboxStatus) gives
// them when asked.
func TestAppliedResourcesInvertSpecResources(t *testing.T) {
	want := &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 64 << 20,
		CpusetCpus: "0", CpusetMems: "0", OomScoreAdj: 500,
		Unified: map[string]string{"memory.high": "50000000"},
	}
	res, err := cgroups.SpecResources(want, cgroups.V2, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &Container{ID: "c", Config: &runtimeapi.ContainerConfig{Linux: &runtimeapi.LinuxContainerConfig{Resources: want}}, Resources: res}
	if got := appliedResources(c); !proto.Equal(got, want) {
		t.Errorf("applied resources:\n%v\nwant\n%v", got, want)
	}
	if got := statusOf(c, shim.State{Status: shim.StatusRunning}).AppliedResources(); !proto.Equal(got, want) {
		t.Errorf("status resources:\n%v\nwant\n%v", got, want)
	}
	if got := appliedResources(&Container{ID: "c"}); got != nil {
		t.Errorf("applied resources of a record without them: %v, want none", got)
	}
}

func TestStatusMessageSaysWhatBerthKnowsOfTheExit(t *testing.T) {
	done := time.Now()
	for _, c := range []struct {
		name        string
		st          shim.State
		reason      string
		wantMessage bool
	}{
		{"completed", shim.State{Status: shim.StatusStopped, FinishedAt: done}, "Completed", false},
		{"failed", shim.State{Status: shim.StatusStopped, ExitCode: 3, FinishedAt: done}, "Error", false},
		{"exit 255 seen", shim.State{Status: shim.StatusStopped, ExitCode: shim.UnknownExitCode, FinishedAt: done}, "Error", false},
		{"oom", shim.State{Status: shim.StatusStopped, ExitCode: 137, OOMKilled: true, FinishedAt: done}, "OOMKilled", true},
		{"exit unseen", shim.State{Status: shim.StatusStopped, ExitCode: shim.UnknownExitCode}, "Error", true},
		{"running", shim.State{Status: shim.StatusRunning}, "", false},
	} {
		st := statusOf(&Container{ID: "c"}, c.st)
		if st.Reason != c.reason || (st.Message != "") != c.wantMessage {
			t.Errorf("%s: reason %q, message %q; want reason %q, a message: %v", c.name, st.Reason, st.Message, c.reason, c.wantMessage)
		}
	}
}

// TestFailedCreateShowsExited: a container kept after its create's rollback
// failed shows as exited, whatever its shim state, saying why.
func TestFailedCreateShowsExited(t *testing.T) {
	c := &Container{ID: "c", Config: &runtimeapi.ContainerConfig{}, CleanupFailed: `create container: rollback step "unmount rootfs": busy`}
	st := statusOf(c, shim.State{ID: "c", Status: shim.StatusCreated})
	if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.Reason != "Error" || !strings.Contains(st.Message, "unmount rootfs") {
		t.Errorf("status %v %q %q; want EXITED, Error, naming the failed step", st.State, st.Reason, st.Message)
	}
}
