package spec

import (
	"fmt"
	"maps"
	"slices"

	"github.com/berth-runtime/berth/sandbox/sysctl"
)

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
		key := sysctl.Dotted(k)
		if _, err := sysctl.Path(key); err != nil {
			return nil, fmt.Errorf("sysctl %q: %w", k, err)
		}
		switch sysctl.NamespaceOf(key) {
		case sysctl.Net:
			if in.HostNet {
				return nil, fmt.Errorf("sysctl %q: not allowed with the host network namespace", k)
			}
		case sysctl.IPC:
			if in.HostIPC {
				return nil, fmt.Errorf("sysctl %q: not allowed with the host IPC namespace", k)
			}
		case sysctl.UTS:
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
