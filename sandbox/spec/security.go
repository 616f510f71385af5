package spec

import (
	"fmt"
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

// DefaultMaskedPaths and DefaultReadonlyPaths are containerd's defaults, used
// unless the CRI security context gives its own lists (never when privileged).
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

func maskedPaths(sc *runtimeapi.LinuxContainerSecurityContext) []string {
	if p := sc.GetMaskedPaths(); len(p) > 0 {
		return slices.Clone(p)
	}
	return slices.Clone(DefaultMaskedPaths)
}

func readonlyPaths(sc *runtimeapi.LinuxContainerSecurityContext) []string {
	if p := sc.GetReadonlyPaths(); len(p) > 0 {
		return slices.Clone(p)
	}
	return slices.Clone(DefaultReadonlyPaths)
}
