package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCreateContainerHungVolume: a volume whose host path sits on a
// filesystem that never answers (a hung NFS server, a FUSE daemon stuck)
// fails CreateContainer within the bound, DeadlineExceeded naming the mount,
// leaves no container behind, and berthd goes on serving, the same pod
// included; a second try at that path fails at once rather than pile up
// another stuck lookup (issue #21, finding 12: such a call hung 7 minutes).
func TestCreateContainerHungVolume(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("hungvolume")
	pod := e.runPod(t, cfg)
	// Mounted after berthd started: released (every waiting lookup ends)
	// before berthd is stopped.
	fs := mountStuckFS(t)
	hung := filepath.Join(fs.dir, "stuck")

	create := func(bound time.Duration) (time.Duration, error) {
		cc := e.ctrConfig("hung", sleeper...)
		cc.Mounts = []*runtimeapi.Mount{{HostPath: hung, ContainerPath: "/data"}}
		// Far beyond the bound: with no bound of its own berthd would
		// hang until this gives up.
		ctx, cancel := context.WithTimeout(t.Context(), bound+30*time.Second)
		defer cancel()
		start := time.Now()
		_, err := e.d.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		return time.Since(start), err
	}
	const bound = 10 * time.Second // spec.hostPathTimeout
	took, err := create(bound)
	assertCode(t, err, one(codes.DeadlineExceeded), "mount /data", hung)
	if took > bound+5*time.Second {
		t.Errorf("CreateContainer took %v, want about %v", took, bound)
	}
	select {
	case <-fs.waiting:
	default:
		t.Error("the FUSE server never saw the lookup: the test proves nothing")
	}
	took, err = create(bound)
	assertCode(t, err, one(codes.DeadlineExceeded), "mount /data", hung, "earlier lookup")
	// At once, not after another wait for the bound; the margin is for the
	// VM tier, whose emulated CPUs took 2.9 s for this refusal beside the
	// cluster tier (2026-11-27).
	if took > bound/2 {
		t.Errorf("CreateContainer again took %v, want at once, not another wait of %v", took, bound)
	}

	list, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
	if err != nil || len(list.Containers) != 0 {
		t.Errorf("containers after the failed creates: %v, %v; want none", list.GetContainers(), err)
	}
	// The pod's lock was let go: the pod takes a container that needs no
	// hung path (bounded: the lock of a call still hanging would hold
	// this one for ever).
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	good, err := e.d.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg,
		Config: e.ctrConfig("good", "/bin/echo", "fine")})
	if err != nil {
		t.Fatalf("CreateContainer beside the hung volume: %v", err)
	}
	e.start(t, good.ContainerId)
	if st := e.waitState(t, good.ContainerId, runtimeapi.ContainerState_CONTAINER_EXITED); st.ExitCode != 0 {
		t.Errorf("a container beside the hung volume exited %d", st.ExitCode)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestHungVolumesFailOnlyTheirPod: a pod whose volumes sit on a hung
// filesystem may use up its own bound on hung lookups, never the node's:
// another pod's CreateContainer with host paths (a volume and the
// kubelet's etc-hosts and termination-log files) still succeeds, while the
// hung pod's next new path is refused ResourceExhausted naming it; once
// the filesystem answers, the hung pod's count is released and it takes a
// container again (#34, finding 4: the bound of 16 was the node's).
func TestHungVolumesFailOnlyTheirPod(t *testing.T) {
	t.Parallel()
	// Each of the pod's hung lookups holds its create for the bound, one
	// after another: 16 of berthd's default 10 s took 170 s of the suite.
	// What is proved is the count, not the bound's length.
	const bound = 2 * time.Second
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("host_path_timeout = %q\n", bound))
	cfgA, cfgB := e.podConfig("hungvolumes-a"), e.podConfig("hungvolumes-b")
	podA, podB := e.runPod(t, cfgA), e.runPod(t, cfgB)
	fs := mountStuckFS(t)

	create := func(pod string, cfg *runtimeapi.PodSandboxConfig, name string, mounts ...*runtimeapi.Mount) (string, error) {
		cc := e.ctrConfig(name, "/bin/cat", "/etc/hosts", "/dev/termination-log")
		cc.Mounts = mounts
		// Far beyond the bound on one lookup.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		r, err := e.d.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		return r.GetContainerId(), err
	}
	hungMount := func(i int) *runtimeapi.Mount {
		return &runtimeapi.Mount{HostPath: filepath.Join(fs.dir, "stuck", strconv.Itoa(i)), ContainerPath: "/data"}
	}
	// One container after another: the pod's lock holds each create for
	// the bound; each leaves one more lookup hanging.
	const perPod = 16 // spec.maxHungLookupsPerPod
	for i := range perPod {
		_, err := create(podA, cfgA, "hung"+strconv.Itoa(i), hungMount(i))
		assertCode(t, err, one(codes.DeadlineExceeded), "mount /data", hungMount(i).HostPath)
	}
	_, err := create(podA, cfgA, "hung-more", hungMount(perPod))
	assertCode(t, err, one(codes.ResourceExhausted), "mount /data", podA)

	// Pod B, as the kubelet makes its containers: a volume, etc-hosts and
	// termination-log, all host paths.
	kubelet := t.TempDir()
	for _, f := range []string{"etc-hosts", "termination-log"} {
		if err := os.WriteFile(filepath.Join(kubelet, f), []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	volume := filepath.Join(kubelet, "volume")
	if err := os.Mkdir(volume, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeletMounts := []*runtimeapi.Mount{
		{HostPath: volume, ContainerPath: "/data"},
		{HostPath: filepath.Join(kubelet, "etc-hosts"), ContainerPath: "/etc/hosts"},
		{HostPath: filepath.Join(kubelet, "termination-log"), ContainerPath: "/dev/termination-log"},
	}
	ok, err := create(podB, cfgB, "beside", kubeletMounts...)
	if err != nil {
		t.Fatalf("pod B's CreateContainer beside pod A's %d hung lookups: %v", perPod, err)
	}
	e.start(t, ok)
	if st := e.waitState(t, ok, runtimeapi.ContainerState_CONTAINER_EXITED); st.ExitCode != 0 {
		t.Errorf("pod B's container exited %d", st.ExitCode)
	}

	// The filesystem answers (with an error): pod A's lookups end, and
	// its count with them.
	fs.release()
	var again string
	if !eventually(time.Minute, func() bool {
		again, err = create(podA, cfgA, "after", kubeletMounts...)
		return status.Code(err) != codes.ResourceExhausted
	}) || err != nil {
		t.Fatalf("pod A's CreateContainer once its lookups answered: %v", err)
	}
	e.start(t, again)
	e.waitState(t, again, runtimeapi.ContainerState_CONTAINER_EXITED)
	e.removePod(t, podA)
	e.removePod(t, podB)
	e.assertNoLeaks(t)
}
