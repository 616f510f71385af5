package spec

import (
	"path"
	"slices"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/sysctl"
)

// FuzzSysctls: a sysctl accepted must land, once the runtime turns its dots
// into slashes, inside a namespace the pod owns.
func FuzzSysctls(f *testing.F) {
	f.Add("net.ipv4.ip_forward", "1", false, false, false)
	f.Add("net/ipv4/conf/eth0.100/rp_filter", "0", false, false, false)
	f.Add("net.a/../../kernel.core_pattern", "|/x", false, false, false)
	f.Add("kernel.shmmax", "1", false, true, false)
	f.Add("kernel.hostname", "h", false, false, true)
	f.Add(" vm.swappiness ", "0", false, false, false)
	f.Fuzz(func(t *testing.T, key, value string, hostNet, hostIPC, hostUTS bool) {
		in := Input{HostNet: hostNet, HostIPC: hostIPC,
			Pod: &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{key: value}}}}
		out, err := buildSysctls(in, hostUTS)
		if err != nil {
			return
		}
		for k := range out {
			// The file the runtime writes, read the way that gives a '/'
			// its meaning: a '.' inside a name.
			p := path.Clean("/proc/sys/" + strings.NewReplacer(".", "/", "/", ".").Replace(k))
			switch {
			case strings.HasPrefix(p, "/proc/sys/net/"):
				if hostNet {
					t.Errorf("sysctl %q (%s) accepted with the host network", key, p)
				}
			case strings.HasPrefix(p, "/proc/sys/fs/mqueue/") || sysctl.NamespaceOf(strings.ReplaceAll(strings.TrimPrefix(p, "/proc/sys/"), "/", ".")) == sysctl.IPC:
				if hostIPC {
					t.Errorf("sysctl %q (%s) accepted with the host IPC namespace", key, p)
				}
			case p == "/proc/sys/kernel/hostname" || p == "/proc/sys/kernel/domainname":
				if hostUTS {
					t.Errorf("sysctl %q (%s) accepted with the host UTS namespace", key, p)
				}
			default:
				t.Errorf("sysctl %q accepted, which writes %s: not in a pod's namespace", key, p)
			}
		}
	})
}

// FuzzCRIMount: a mount accepted targets a clean absolute path other than /,
// binds an absolute host path, and is never less confined than asked.
func FuzzCRIMount(f *testing.F) {
	f.Add("/data", "/tmp", int32(0), true, true, "noexec")
	f.Add("/data/../..", "/", int32(2), false, false, "")
	f.Add("relative", "/tmp", int32(1), false, false, "rbind")
	f.Add("/ro", "/tmp", int32(0), true, false, "rw")
	f.Add("/x", "/tmp", int32(0), false, false, "shared")
	f.Fuzz(func(t *testing.T, dst, src string, prop int32, readonly, rro bool, option string) {
		m := &runtimeapi.Mount{ContainerPath: dst, HostPath: src, Propagation: runtimeapi.MountPropagation(prop),
			Readonly: readonly, RecursiveReadOnly: rro, MountOptions: []string{option}}
		bm, _, err := criMount("fuzz-pod", m, "")
		if err != nil {
			return
		}
		if !path.IsAbs(bm.Destination) || path.Clean(bm.Destination) != bm.Destination || bm.Destination == "/" {
			t.Errorf("container_path %q became destination %q", dst, bm.Destination)
		}
		if !path.IsAbs(bm.Source) {
			t.Errorf("host_path %q became source %q", src, bm.Source)
		}
		if readonly && (!slices.Contains(bm.Options, "ro") || slices.Contains(bm.Options, "rw")) {
			t.Errorf("a read-only mount has options %v", bm.Options)
		}
		for _, loosening := range []string{"rw", "suid", "dev", "exec", "shared", "rshared"} {
			if slices.Contains(bm.Options, loosening) && !(loosening == "rw" && !readonly) &&
				!(loosening == "rshared" && prop == int32(runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL)) {
				t.Errorf("mount_options %q put %q in the mount's options %v", option, loosening, bm.Options)
			}
		}
	})
}
