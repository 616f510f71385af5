package spec

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/berth-runtime/berth/sandbox/sysctl"
)

// ipcSysctls are the IPC-namespaced sysctls besides fs.mqueue.*.
var ipcSysctls = map[string]bool{
	"kernel.msgmax":          true,
	"kernel.msgmnb":          true,
	"kernel.msgmni":          true,
	"kernel.sem":             true,
	"kernel.shmall":          true,
	"kernel.shmmax":          true,
	"kernel.shmmni":          true,
	"kernel.shm_rmid_forced": true,
}

// utsSysctls are set by the hostname; they belong to the UTS namespace.
var utsSysctls = map[string]bool{
	"kernel.hostname":   true,
	"kernel.domainname": true,
}

// buildSysctls keeps the pod's sysctls, each of which must belong to a
// namespace the container does not share with the host: net.* needs its own
// network namespace, the IPC ones their own IPC namespace, kernel.hostname and
// kernel.domainname their own UTS namespace. Anything else (a node-wide
// sysctl) is refused. Errors name the key.
func buildSysctls(in Input, hostUTS bool) (map[string]string, error) {
	src := in.Pod.GetLinux().GetSysctls()
	if len(src) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(src))
	for _, k := range slices.Sorted(maps.Keys(src)) {
		v := src[k]
		key := sysctl.Dotted(strings.TrimSpace(k))
		if _, err := sysctl.Path(key); err != nil {
			return nil, fmt.Errorf("sysctl %q: %w", k, err)
		}
		switch {
		case strings.HasPrefix(key, "net."):
			if in.HostNet {
				return nil, fmt.Errorf("sysctl %q: not allowed with the host network namespace", k)
			}
		case ipcSysctls[key] || strings.HasPrefix(key, "fs.mqueue."):
			if in.HostIPC {
				return nil, fmt.Errorf("sysctl %q: not allowed with the host IPC namespace", k)
			}
		case utsSysctls[key]:
			if hostUTS {
				return nil, fmt.Errorf("sysctl %q: not allowed with the host UTS namespace", k)
			}
		default:
			return nil, fmt.Errorf("sysctl %q: not namespaced, refused (it would change the whole node)", k)
		}
		out[key] = v
	}
	return out, nil
}
