package integration

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// After a reboot the volatile state folder is empty and no process of any
// pod runs. berth must still report its pods (NOTREADY) and containers
// (EXITED) and let the kubelet remove them without leaving anything.
func TestPodsAfterReboot(t *testing.T) {
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
