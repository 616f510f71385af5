package spec

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultCapabilities is the set a non-privileged container starts with (the
// one containerd and CRI-O use), in its bounding, effective and permitted sets.
var DefaultCapabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FSETID",
	"CAP_FOWNER",
	"CAP_MKNOD",
	"CAP_NET_RAW",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETFCAP",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT",
	"CAP_KILL",
	"CAP_AUDIT_WRITE",
}

// DefaultMaskedPaths and DefaultReadonlyPaths are the lists the kubelet sends
// for procMount Default (containerd's defaults too), and those of the pause's
// /proc. A container has the lists its client sends, or these (see
// procPaths).
var (
	DefaultMaskedPaths = []string{
		"/proc/acpi",
		"/proc/asound",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/proc/sched_debug",
		"/proc/scsi",
		"/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
	DefaultReadonlyPaths = []string{
		"/proc/bus",
		"/proc/fs",
		"/proc/irq",
		"/proc/sys",
		"/proc/sysrq-trigger",
	}
)

// capNames are the Linux capabilities by number (linux/capability.h).
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
	"CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
	"CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// capLastCapPath is read for the running kernel's highest capability number.
var capLastCapPath = "/proc/sys/kernel/cap_last_cap"

// kernelCapabilities returns every capability the running kernel knows (and
// this package can name). Without a readable cap_last_cap it assumes all.
func kernelCapabilities() []string {
	last := len(capNames) - 1
	if b, err := os.ReadFile(capLastCapPath); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && n < last {
			last = n
		}
	}
	return slices.Clone(capNames[:last+1])
}

// capName normalises "net_admin", "CAP_NET_ADMIN", ... to "CAP_NET_ADMIN".
func capName(field, s string) (string, error) {
	n := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(n, "CAP_") {
		n = "CAP_" + n
	}
	if !slices.Contains(capNames, n) {
		return "", fmt.Errorf("%s: unknown capability %q", field, s)
	}
	return n, nil
}

func isAll(s string) bool { return strings.EqualFold(strings.TrimSpace(s), "ALL") }

// capabilities computes the process capabilities. Privileged: every
// capability of the kernel. Otherwise DefaultCapabilities, then "ALL" in
// add_capabilities / drop_capabilities, then the single adds, then the single
// drops (so {add: [ALL], drop: [CHOWN]} is everything but CAP_CHOWN).
// add_ambient_capabilities go to every set, ambient and inheritable included
// (the kernel needs a capability permitted and inheritable to be ambient).
func capabilities(sc *runtimeapi.LinuxContainerSecurityContext) (*specs.LinuxCapabilities, error) {
	var set []string
	caps := sc.GetCapabilities()
	if sc.GetPrivileged() {
		set = kernelCapabilities()
	} else {
		set = slices.Clone(DefaultCapabilities)
		if slices.ContainsFunc(caps.GetAddCapabilities(), isAll) {
			set = kernelCapabilities()
		}
		if slices.ContainsFunc(caps.GetDropCapabilities(), isAll) {
			set = nil
		}
		for _, c := range caps.GetAddCapabilities() {
			if isAll(c) {
				continue
			}
			n, err := capName("add_capabilities", c)
			if err != nil {
				return nil, err
			}
			if !slices.Contains(set, n) {
				set = append(set, n)
			}
		}
		for _, c := range caps.GetDropCapabilities() {
			if isAll(c) {
				continue
			}
			n, err := capName("drop_capabilities", c)
			if err != nil {
				return nil, err
			}
			set = slices.DeleteFunc(set, func(x string) bool { return x == n })
		}
	}
	var ambient []string
	for _, c := range caps.GetAddAmbientCapabilities() {
		n, err := capName("add_ambient_capabilities", c)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ambient, n) {
			ambient = append(ambient, n)
		}
		if !slices.Contains(set, n) {
			set = append(set, n)
		}
	}
	return &specs.LinuxCapabilities{
		Bounding:    set,
		Effective:   slices.Clone(set),
		Permitted:   slices.Clone(set),
		Inheritable: ambient,
		Ambient:     slices.Clone(ambient),
	}, nil
}

// procPaths returns the masked and read-only paths of a container that is
// not privileged: each list as sent, but an empty one in the host's user
// namespace is its default. On the wire an empty list is an absent one, so
// a client that sends none (crictl, a script) would otherwise get a /proc
// whose root may write /proc/sys/kernel/core_pattern, host root. The kubelet
// sends empty lists for procMount Unmasked, which Kubernetes allows only
// with hostUsers: false (KEP-4265): in a pod with its own user namespace
// (ownUserNS) an empty list masks nothing.
func procPaths(sc *runtimeapi.LinuxContainerSecurityContext, ownUserNS bool) (masked, readonly []string) {
	sentOrDefault := func(sent, def []string) []string {
		if len(sent) == 0 && !ownUserNS {
			return slices.Clone(def)
		}
		return slices.Clone(sent)
	}
	return sentOrDefault(sc.GetMaskedPaths(), DefaultMaskedPaths), sentOrDefault(sc.GetReadonlyPaths(), DefaultReadonlyPaths)
}

// PauseID is the user and group the pause runs as when the pod names none:
// the overflow ID ("nobody") that other runtimes' pause images use too.
const PauseID = 65535

// PauseUser returns the user of a pod's pause process: the pod's
// run_as_user and run_as_group, else PauseID. The pause has no
// supplementary groups (supplemental_groups are the containers'), nor
// capabilities: root in a container that shares its PID namespace may trace
// it, and must find nothing there it does not already have.
//
// uids and gids are how many IDs from 0 up the pod's user namespace maps
// (math.MaxUint32 in the host's): a given ID must be mapped, and a shorter
// mapping than PauseID needs gets its highest ID as the default.
//
// run_as_group alone is honoured, not refused as the CRI asks: the kubelet
// sends it for a pod-level runAsGroup whose runAsUser is set per container.
func PauseUser(sc *runtimeapi.LinuxSandboxSecurityContext, uids, gids uint32) (specs.User, error) {
	uid, err := pauseID("linux.security_context.run_as_user", sc.GetRunAsUser(), uids)
	if err != nil {
		return specs.User{}, err
	}
	gid, err := pauseID("linux.security_context.run_as_group", sc.GetRunAsGroup(), gids)
	if err != nil {
		return specs.User{}, err
	}
	return specs.User{UID: uid, GID: gid}, nil
}

// pauseID is the ID field asks for, or the default, within the mapped IDs
// [0, mapped).
func pauseID(field string, v *runtimeapi.Int64Value, mapped uint32) (uint32, error) {
	if v == nil {
		return min(PauseID, mapped-1), nil
	}
	switch id := v.GetValue(); {
	case id < 0 || id >= math.MaxUint32:
		return 0, fmt.Errorf("%s: invalid ID %d", field, id)
	case id >= int64(mapped):
		return 0, fmt.Errorf("%s: ID %d is not mapped in the pod's user namespace (it maps 0 to %d)", field, id, mapped-1)
	default:
		return uint32(id), nil
	}
}

// CheckPrivileged refuses a privileged container in a pod that did not say
// it would run one: the CRI makes the pod's privileged field a promise
// ("If a privileged container is to be executed within it, this MUST be
// true"), so a pod that did not make it gets no container with every
// capability and device. A pod with its own user namespace gets none
// either: privileged there means root over the host's devices and kernel
// interfaces from an unprivileged user namespace, which the kubelet itself
// refuses (hostUsers: false with a privileged container).
func CheckPrivileged(pod *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) error {
	if !cfg.GetLinux().GetSecurityContext().GetPrivileged() {
		return nil
	}
	podSC := pod.GetLinux().GetSecurityContext()
	if !podSC.GetPrivileged() {
		return fmt.Errorf("config.linux.security_context.privileged: the pod is not privileged (its linux.security_context.privileged is false)")
	}
	// POD is the enum's zero value: only present options can ask for it.
	if u := podSC.GetNamespaceOptions().GetUsernsOptions(); u != nil && u.GetMode() == runtimeapi.NamespaceMode_POD {
		return fmt.Errorf("config.linux.security_context.privileged: the pod has its own user namespace (namespace_options.userns_options.mode POD)")
	}
	return nil
}
