package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// After a reboot the volatile state folder is empty and no process of any
// pod runs. berth must still report its pods (NOTREADY) and containers
// (EXITED) and let the kubelet remove them without leaving anything.
func TestPodsAfterReboot(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("reboot")
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}}
	pod := e.runPod(t, cfg)
	ctr := e.createContainer(t, pod, cfg, "sleeper", "/bin/sleep", "1000")
	e.start(t, ctr)
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)

	// The reboot: berthd, the shim and the container die; /run is emptied.
	procs := []int{e.ctrPID(t, ctr), e.shimPID(t, pod)}
	e.d.Kill()
	for _, pid := range procs {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", pid, err)
		}
	}
	pods := filepath.Join(e.d.State, "pods")
	for unix.Unmount(pods, unix.MNT_DETACH) == nil {
	}
	if err := os.RemoveAll(e.d.State); err != nil {
		t.Fatal(err)
	}
	e.d.Restart()

	if st := e.podStatus(t, pod); st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("pod after the reboot is %s, want NOTREADY", st.State)
	}
	list, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{})
	if err != nil || len(list.Containers) != 1 || list.Containers[0].State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("containers after the reboot = %v, %v; want the one, EXITED", list.GetContainers(), err)
	}
	if st := e.status(t, ctr); st.ExitCode != 255 || st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("container after the reboot: %s, exit %d; want EXITED with the unknown exit code 255", st.State, st.ExitCode)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// A shim that dies while berthd runs makes its pod NOTREADY at once (the
// kubelet then recreates it), with nothing of the pod left running.
func TestShimDeathMakesPodNotReady(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("shim-death") // POD-scoped PID namespace: a pause runs too
	pod := e.runPod(t, cfg)
	ctr := e.createContainer(t, pod, cfg, "sleeper", "/bin/sleep", "1000")
	e.start(t, ctr)
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	ctrPID := e.ctrPID(t, ctr)

	if err := syscall.Kill(e.shimPID(t, pod), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool {
		return e.podStatus(t, pod).State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	}) {
		t.Fatal("the pod of a dead shim is still READY after 5 s")
	}
	if st := e.status(t, ctr); st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("container of a dead shim is %s, want EXITED", st.State)
	}
	if !eventually(5*time.Second, func() bool { return !alive(ctrPID) }) {
		t.Errorf("container process %d still runs after its shim died", ctrPID)
	}
	if !strings.Contains(e.d.Logs(), "pod shim exited") {
		t.Error("berthd did not log the lost shim")
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
