package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestRunPodFailedRollbackKeepsPod: when a RunPodSandbox fails and its
// rollback cannot remove what it made, here the pod's cgroup, which holds a
// process the test put there, berthd keeps the pod, NOTREADY, saying which
// step failed, with what it still holds, across a restart; once the
// process is gone, the kubelet's StopPodSandbox and RemovePodSandbox
// finish it and nothing is left.
//
// The run fails at the pod's files, after its cgroup is made: a DNS search
// domain with a space is refused only when resolv.conf is written.
func TestRunPodFailedRollbackKeepsPod(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("rollback-kept")
	cfg.DnsConfig = &runtimeapi.DNSConfig{Searches: []string{"not one word"}}
	holder := holdCgroup(t, cfg.Linux.CgroupParent)

	_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	assertCode(t, err, one(codes.InvalidArgument), "DNS search domain")
	pod := assertKeptPod(t, e, "rollback-kept")
	if _, err := os.Stat(filepath.Join(e.d.State, "pods", pod)); err != nil {
		t.Errorf("the kept pod's folder: %v", err)
	}
	e.d.Restart()
	if again := assertKeptPod(t, e, "rollback-kept"); again != pod {
		t.Fatalf("after a restart the kept pod is %s, want %s", again, pod)
	}

	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	holder.Wait() // reaped: out of the cgroup
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// assertKeptPod checks that the one pod named name is listed NOTREADY and
// that its verbose status names the rollback step that failed and the cgroup
// it still holds; it returns the pod's ID.
func assertKeptPod(t *testing.T, e *podEnv, name string) string {
	t.Helper()
	ids := e.listPodIDs(t, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": name}})
	if len(ids) != 1 {
		t.Fatalf("pods named %s after a failed rollback: %v, want the pod kept", name, ids)
	}
	st := e.podStatus(t, ids[0])
	if st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("kept pod %s is %v, want NOTREADY", ids[0], st.State)
	}
	var info struct {
		Pod struct {
			CleanupFailed string `json:"cleanupFailed"`
			Cgroup        string `json:"cgroup"`
		} `json:"pod"`
	}
	e.verbosePodInfo(t, ids[0], &info)
	if !strings.Contains(info.Pod.CleanupFailed, "remove pod cgroup") || info.Pod.Cgroup == "" {
		t.Errorf("kept pod's record: %+v; want the failed step (remove pod cgroup) and its cgroup", info.Pod)
	}
	return ids[0]
}

// holdCgroup makes cgroup rel (in the pids hierarchy on cgroup v1, in the
// unified tree on v2) with a process of the test's in it, which nothing
// else kills: no one can remove the cgroup until the test ends it. It
// returns the process, killed at the end of the test if still running.
func holdCgroup(t *testing.T, rel string) *exec.Cmd {
	t.Helper()
	dir := filepath.Join("/sys/fs/cgroup", "pids", rel)
	if cgroupV2() {
		dir = filepath.Join("/sys/fs/cgroup", rel)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("sleep", "3600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(holder.Process.Pid)), 0o644); err != nil {
		t.Fatalf("move the holder into %s: %v", dir, err)
	}
	return holder
}
