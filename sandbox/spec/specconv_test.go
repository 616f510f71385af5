package spec

import (
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs/validate"
	"github.com/opencontainers/runc/libcontainer/specconv"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The spec must be one that runc's specconv converts and libcontainer's
// validator accepts, as the shim will do with it.
func TestSpecconvAccepts(t *testing.T) {
	in := baseInput(t)
	podFiles(t, &in)
	in.NetNS, in.IPCNS, in.UTSNS = "", "", ""
	in.Pod.Linux = &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"net.core.somaxconn": "100", "kernel.shm_rmid_forced": "1"}}
	host := t.TempDir()
	in.Config.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: host, Readonly: true, Propagation: runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL}}
	in.Config.Devices = []*runtimeapi.Device{{HostPath: "/dev/null", ContainerPath: "/dev/xnull", Permissions: "rw"}}
	in.CgroupsPath = "/kubepods/pod1/c1"
	for _, priv := range []bool{false, true} {
		secCtx(&in).Privileged = priv
		s, err := Generate(in)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{CgroupName: "c1", Spec: s})
		if err != nil {
			t.Fatalf("privileged=%v: specconv: %v", priv, err)
		}
		if err := validate.Validate(cfg); err != nil {
			t.Fatalf("privileged=%v: validate: %v", priv, err)
		}
	}
}
