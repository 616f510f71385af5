package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cgroupValue reads a container cgroup file: the v1 controller's file on a
// hybrid host, the unified file under cgroup2.
func cgroupValue(t *testing.T, cgroup, v1Controller, v1File, v2File string) string {
	t.Helper()
	path := filepath.Join("/sys/fs/cgroup", v1Controller, cgroup, v1File)
	if cgroups.DetectMode() == cgroups.V2 {
		path = filepath.Join("/sys/fs/cgroup", cgroup, v2File)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestUpdateContainerResources(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("update")
	pod := e.runPod(t, cfg)
	ctr := e.createContainer(t, pod, cfg, "sleeper", "/bin/sleep", "1000")
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_RUNNING)
	cgroup := filepath.Join(cfg.Linux.CgroupParent, ctr)

	_, err := e.d.Runtime.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctr,
		Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 96 << 20, CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000}})
	if err != nil {
		t.Fatal(err)
	}
	shares := "512"
	if cgroups.DetectMode() == cgroups.V2 {
		shares = fmt.Sprint(cgroups.SharesToWeight(512))
	}
	checks := []struct{ ctrl, v1File, v2File, want string }{
		{"memory", "memory.limit_in_bytes", "memory.max", "100663296"},
		{"cpu", "cpu.cfs_quota_us", "cpu.max", "50000"}, // v2: "50000 100000"
		{"cpu", "cpu.shares", "cpu.weight", shares},
	}
	for _, c := range checks {
		if got := cgroupValue(t, cgroup, c.ctrl, c.v1File, c.v2File); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: %q after the update, want %q", c.v1File, got, c.want)
		}
	}
	st, err := e.d.Runtime.ContainerStatus(t.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: ctr, Verbose: true})
	if err != nil || !strings.Contains(st.Info["info"], `"limit":100663296`) {
		t.Errorf("verbose status does not show the new memory limit: %v %.300s", err, st.GetInfo()["info"])
	}

	_, err = e.d.Runtime.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctr,
		Linux: &runtimeapi.LinuxContainerResources{CpuQuota: 50000}})
	assertCode(t, err, one(codes.InvalidArgument), "period")
	_, err = e.d.Runtime.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: "nope",
		Linux: &runtimeapi.LinuxContainerResources{}})
	assertCode(t, err, one(codes.NotFound), "")
	e.removePod(t, pod)
}

// TestUpdatePodSandboxResources: the pod-level resources of an in-place
// resize are kept in the pod's config, through a berthd restart; bad
// resources and unknown pods are refused and change nothing.
func TestUpdatePodSandboxResources(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	pod := e.runPod(t, e.podConfig("podres"))
	update := func(id string, res *runtimeapi.LinuxContainerResources) error {
		_, err := e.d.Runtime.UpdatePodSandboxResources(t.Context(), &runtimeapi.UpdatePodSandboxResourcesRequest{
			PodSandboxId: id, Resources: res, Overhead: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 8 << 20}})
		return err
	}
	want := &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 96 << 20, CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000}
	if err := update(pod, want); err != nil {
		t.Fatal(err)
	}
	recorded := func() *runtimeapi.LinuxPodSandboxConfig {
		var info struct {
			Pod struct {
				Config json.RawMessage `json:"config"`
			} `json:"pod"`
		}
		e.verbosePodInfo(t, pod, &info)
		var cfg runtimeapi.PodSandboxConfig
		if err := protojson.Unmarshal(info.Pod.Config, &cfg); err != nil {
			t.Fatalf("pod config in the verbose status: %v: %s", err, info.Pod.Config)
		}
		return cfg.Linux
	}
	check := func(when string) {
		t.Helper()
		got := recorded()
		if !proto.Equal(got.GetResources(), want) || got.GetOverhead().GetMemoryLimitInBytes() != 8<<20 {
			t.Errorf("%s: pod config has resources %v, overhead %v; want %v and 8 MiB", when, got.GetResources(), got.GetOverhead(), want)
		}
	}
	check("after the update")

	assertCode(t, update(pod, &runtimeapi.LinuxContainerResources{CpuQuota: 50000}), one(codes.InvalidArgument), "resources")
	assertCode(t, update("nope", want), one(codes.NotFound), "nope")
	check("after refused updates")

	e.d.Restart()
	check("after a berthd restart")
	e.removePod(t, pod)
}

// TestPodCgroupOfTheKubelet: a pod cgroup that exists before RunPodSandbox
// (the kubelet makes it, sized from every container and the overhead) keeps
// its limits; the CRI's pod-level resources, which add up only the limits
// containers declare, are applied only to a pod cgroup berth makes itself.
func TestPodCgroupOfTheKubelet(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	res := &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20}

	kubelets := e.podConfig("kubelets-cgroup")
	kubelets.Linux.Resources = res
	cg := kubelets.Linux.CgroupParent
	makeCgroup(t, cg)
	// Resources the host cannot honour are refused there too, though not written.
	bad := e.podConfig("kubelets-cgroup")
	bad.Linux.Resources = &runtimeapi.LinuxContainerResources{CpuQuota: 50000}
	if _, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: bad}); err == nil || !strings.Contains(err.Error(), "period") {
		t.Errorf("RunPodSandbox with a CPU quota and no period in the kubelet's pod cgroup: %v, want it refused naming the period", err)
	}
	if len(harness.CgroupDirs(cg)) == 0 {
		t.Fatal("the refused RunPodSandbox removed the kubelet's pod cgroup")
	}
	pod := e.runPod(t, kubelets)
	if got := cgroupValue(t, cg, "memory", "memory.limit_in_bytes", "memory.max"); got == fmt.Sprint(64<<20) {
		t.Errorf("the existing pod cgroup got the pod-level memory limit %s", got)
	}
	e.removePod(t, pod)

	berths := e.podConfig("berths-cgroup")
	berths.Linux.Resources = res
	pod = e.runPod(t, berths)
	if got := cgroupValue(t, berths.Linux.CgroupParent, "memory", "memory.limit_in_bytes", "memory.max"); got != fmt.Sprint(64<<20) {
		t.Errorf("the pod cgroup berth made has memory limit %s, want %d", got, 64<<20)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// makeCgroup makes a cgroup in every hierarchy, as the kubelet makes a pod's.
func makeCgroup(t *testing.T, rel string) {
	t.Helper()
	t.Cleanup(func() { removeCgroupDirs(rel) })
	if cgroups.DetectMode() == cgroups.V2 {
		if err := os.MkdirAll(filepath.Join("/sys/fs/cgroup", rel), 0o755); err != nil {
			t.Fatal(err)
		}
		return
	}
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, m := range mounts {
		if st, err := os.Stat(m); err != nil || !st.IsDir() {
			continue
		}
		if err := os.MkdirAll(filepath.Join(m, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}
