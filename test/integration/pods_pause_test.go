package integration

import (
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestPauseDeath: in a pod sharing one PID namespace the pause is PID 1,
// and root in any container can signal it. Signals from the pod leave it
// (and so every container) running; when it dies anyway (killed from the
// node) the pod turns NOTREADY, so the kubelet recreates it, and no
// container can be added to it any more.
func TestPauseDeath(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	const pod = runtimeapi.NamespaceMode_POD
	cfg := podWithNamespaces(e, "pause-death", &runtimeapi.NamespaceOption{Network: pod, Ipc: pod, Pid: pod})
	id := e.runPod(t, cfg)
	ctr := e.runContainer(t, id, cfg, e.ctrConfig("signaller", sleeper...))
	var info struct {
		Pod struct {
			PausePID int `json:"pausePID"`
		} `json:"pod"`
	}
	e.verbosePodInfo(t, id, &info)
	pause := info.Pod.PausePID
	if pause == 0 || !alive(pause) {
		t.Fatalf("no live pause process (pid %d)", pause)
	}

	for _, sig := range []string{"TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "SEGV", "ABRT", "PIPE", "ALRM", "STOP"} {
		e.sh(t, ctr, "kill -"+sig+" 1")
	}
	time.Sleep(300 * time.Millisecond)
	if !alive(pause) {
		t.Fatal("a signal from a container ended the pause")
	}
	if st := e.podStatus(t, id).State; st != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod is %v after the signals, want READY", st)
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)

	if err := syscall.Kill(pause, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool {
		return e.podStatus(t, id).State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	}) {
		t.Fatal("the pod is still READY after its pause died")
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED)
	_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: id, SandboxConfig: cfg, Config: e.ctrConfig("late", sleeper...)})
	assertCode(t, err, one(codes.FailedPrecondition), "not ready")

	e.removePod(t, id)
	e.assertNoLeaks(t)
}
