package sandbox

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// usernsField is the CRI field every user-namespace refusal names.
const usernsField = "linux.security_context.namespace_options.userns_options"

// checkUserns refuses a pod's user-namespace request that berth cannot
// honour, before anything of the pod exists. No options, or mode NODE, is
// the host's user namespace (POD is the enum's zero value, so an absent
// message must not be read as POD). A pod of its own (mode POD) must map container
// ID 0 with exactly one uid and one gid range, the shape the kubelet sends.
// berth does not create user namespaces yet, so a valid POD request is a
// failed precondition rather than a pod run with host IDs.
func checkUserns(cfg *runtimeapi.PodSandboxConfig) error {
	o := namespaceOptions(cfg).GetUsernsOptions()
	if o == nil {
		return nil
	}
	switch o.GetMode() {
	case runtimeapi.NamespaceMode_NODE:
		if len(o.GetUids()) != 0 || len(o.GetGids()) != 0 {
			return wrapf(ErrInvalid, "%s: mode NODE takes no uids or gids", usernsField)
		}
		return nil
	case runtimeapi.NamespaceMode_POD:
	default:
		return wrapf(ErrInvalid, "%s.mode %s: only NODE and POD are supported", usernsField, o.GetMode())
	}
	if err := checkIDMapping(usernsField+".uids", o.GetUids()); err != nil {
		return err
	}
	if err := checkIDMapping(usernsField+".gids", o.GetGids()); err != nil {
		return err
	}
	return wrapf(ErrFailedPrecondition, "%s.mode POD: this runtime does not create user namespaces (Status advertises user_namespaces false)", usernsField)
}

// checkIDMapping wants one range that maps container ID 0 to a host range
// that does not wrap around.
func checkIDMapping(field string, m []*runtimeapi.IDMapping) error {
	switch {
	case len(m) != 1:
		return wrapf(ErrInvalid, "%s: want exactly one mapping, got %d", field, len(m))
	case m[0].GetContainerId() != 0:
		return wrapf(ErrInvalid, "%s: container ID 0 is not mapped (mapping starts at %d)", field, m[0].GetContainerId())
	case m[0].GetLength() == 0:
		return wrapf(ErrInvalid, "%s: mapping length is 0", field)
	case uint64(m[0].GetHostId())+uint64(m[0].GetLength()) > 1<<32-1:
		return wrapf(ErrInvalid, "%s: host range %d+%d goes past the largest ID", field, m[0].GetHostId(), m[0].GetLength())
	}
	return nil
}
