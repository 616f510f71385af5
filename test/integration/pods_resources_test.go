package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cgroups"
)

// cgroupV2 reports whether the host runs the unified hierarchy only.
func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// cgroupFile reads a file of cgroup rel: on v1 in the hierarchy of
// controller, on v2 in the unified tree.
func cgroupFile(t *testing.T, controller, rel, file string) string {
	t.Helper()
	dir := filepath.Join("/sys/fs/cgroup", controller, rel)
	if cgroupV2() {
		dir = filepath.Join("/sys/fs/cgroup", rel)
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatalf("cgroup file: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// TestContainerResources checks that LinuxContainerResources land in the
// container's own cgroup, <cgroup_parent>/<container id>, as the kernel
// reports them from the host and from inside the container, and that the
// container's process is in it.
func TestContainerResources(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("resources")
	pod := e.runPod(t, cfg)
	podCgroup := e.podCgroup(t, pod)

	type file struct{ controller, name, want string }
	for _, c := range []struct {
		name   string
		res    *runtimeapi.LinuxContainerResources
		v1, v2 []file
		memory string // memory limit as the container reads it
	}{
		{
			name: "limited",
			res: &runtimeapi.LinuxContainerResources{
				CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000,
				MemoryLimitInBytes: 64 << 20, CpusetCpus: "0", CpusetMems: "0", OomScoreAdj: 500,
			},
			v1: []file{
				{"cpu", "cpu.shares", "512"}, {"cpu", "cpu.cfs_quota_us", "50000"}, {"cpu", "cpu.cfs_period_us", "100000"},
				{"memory", "memory.limit_in_bytes", "67108864"},
				{"cpuset", "cpuset.cpus", "0"}, {"cpuset", "cpuset.mems", "0"},
			},
			v2: []file{
				// runc's (and the kubelet's) conversion: 512 shares → 59.
				{"", "cpu.weight", strconv.FormatUint(cgroups.SharesToWeight(512), 10)}, {"", "cpu.max", "50000 100000"}, {"", "memory.max", "67108864"},
				{"", "cpuset.cpus", "0"}, {"", "cpuset.mems", "0"},
			},
			memory: "67108864",
		},
		{
			// Nothing asked, nothing limited: the values above came from the
			// config, not from defaults.
			name: "unlimited",
			res:  &runtimeapi.LinuxContainerResources{},
			v1: []file{
				{"cpu", "cpu.shares", "1024"}, {"cpu", "cpu.cfs_quota_us", "-1"},
				{"memory", "memory.limit_in_bytes", "9223372036854771712"},
			},
			v2:     []file{{"", "cpu.max", "max 100000"}, {"", "memory.max", "max"}},
			memory: "9223372036854771712",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc := e.ctrConfig(c.name, sleeper...)
			cc.Linux = &runtimeapi.LinuxContainerConfig{Resources: c.res}
			ctr := e.runContainer(t, pod, cfg, cc)
			rel := filepath.Join(podCgroup, ctr)
			files, memFile := c.v1, "/sys/fs/cgroup/memory/memory.limit_in_bytes"
			if cgroupV2() {
				files, memFile = c.v2, "/sys/fs/cgroup/memory.max"
				if c.memory == "9223372036854771712" {
					c.memory = "max"
				}
			}
			for _, f := range files {
				if got := cgroupFile(t, f.controller, rel, f.name); got != f.want {
					t.Errorf("%s/%s = %q, want %q", rel, f.name, got, f.want)
				}
			}
			pid := e.ctrPID(t, ctr)
			procs := strings.Fields(cgroupFile(t, "memory", rel, "cgroup.procs"))
			if !slices.Contains(procs, strconv.Itoa(pid)) {
				t.Errorf("container pid %d is not in %s (procs %v)", pid, rel, procs)
			}
			// The container's cgroup namespace makes its cgroup its root.
			if got := e.sh(t, ctr, "cat "+memFile); got != c.memory {
				t.Errorf("inside, %s = %q, want %q", memFile, got, c.memory)
			}
			if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "oom_score_adj")); err != nil ||
				strings.TrimSpace(string(b)) != strconv.FormatInt(c.res.OomScoreAdj, 10) {
				t.Errorf("oom_score_adj = %q (%v), want %d", b, err, c.res.OomScoreAdj)
			}
		})
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestContainerOOMKilled checks that a container killed by its memory limit
// reports EXITED, exit code 137 and reason OOMKilled, and that a container
// that stays within its limit does not.
func TestContainerOOMKilled(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("oom")
	pod := e.runPod(t, cfg)
	// The shell keeps the whole command substitution in memory: N bytes.
	hog := func(n int) string {
		return "x=$(/bin/busybox head -c " + strconv.Itoa(n) + " /dev/zero | /bin/busybox tr '\\0' a); echo survived ${#x}"
	}
	for _, c := range []struct {
		name   string
		script string
		code   int32
		reason string
		out    string
	}{
		{"over-the-limit", hog(64 << 20), 137, "OOMKilled", ""},
		{"within-the-limit", hog(1 << 20), 0, "Completed", "survived 1048576\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc := e.ctrConfig(c.name, "/bin/sh", "-c", c.script)
			cc.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}}
			st, out := e.runToExit(t, pod, cfg, cc)
			if st.ExitCode != c.code || st.Reason != c.reason || out != c.out {
				t.Errorf("exit code %d, reason %q, output %q; want %d, %q, %q", st.ExitCode, st.Reason, out, c.code, c.reason, c.out)
			}
		})
	}
	if ps := e.podStatus(t, pod); ps.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod is %s after the OOM kill", ps.State)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
