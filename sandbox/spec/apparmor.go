package spec

import (
	"fmt"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// AppArmorHost is what the spec needs of the host's AppArmor (the
// sandbox/apparmor package's Host). A nil one is a host without AppArmor.
type AppArmorHost interface {
	Enabled() bool
	Why() string                      // why it is not enabled
	Default() (string, error)         // berth's RuntimeDefault profile, or why it is not loaded
	Loaded(name string) (bool, error) // whether the kernel has that profile
}

// buildAppArmor returns the AppArmor profile the container's process runs
// under ("" for none). The apparmor field wins over the deprecated
// apparmor_profile; with neither the runtime default applies, as in other
// runtimes. Without AppArmor on the host, RuntimeDefault and Unconfined run
// unconfined and a Localhost profile is refused. A privileged container
// gets a profile only when it names one.
func buildAppArmor(sc *runtimeapi.LinuxContainerSecurityContext, host AppArmorHost) (string, error) {
	//lint:ignore SA1019 kubelets still send the deprecated field
	return appArmorFor(sc.GetApparmor(), sc.GetApparmorProfile(), sc.GetPrivileged(), host)
}

// PauseAppArmor returns the AppArmor profile of a pod's pause process from
// the pod's security context, by the rules of buildAppArmor.
func PauseAppArmor(sc *runtimeapi.LinuxSandboxSecurityContext, host AppArmorHost) (string, error) {
	return appArmorFor(sc.GetApparmor(), "", sc.GetPrivileged(), host)
}

func appArmorFor(p *runtimeapi.SecurityProfile, deprecated string, privileged bool, host AppArmorHost) (string, error) {
	kind, name, err := pickProfile("apparmor", p, "apparmor_profile", deprecated, profileRuntimeDefault)
	if err != nil {
		return "", err
	}
	// The kubelet sends the profile name with the prefix of the deprecated
	// form in localhost_ref too.
	name = strings.TrimPrefix(name, "localhost/")
	enabled := host != nil && host.Enabled()
	switch {
	case kind == profileLocalhost && !enabled:
		why := "AppArmor is not enabled on this host"
		if host != nil {
			why = host.Why()
		}
		return "", fmt.Errorf("apparmor: localhost profile %q: %s", name, why)
	case kind == profileLocalhost:
		loaded, err := host.Loaded(name)
		if err != nil {
			return "", fmt.Errorf("apparmor: localhost profile %q: %w", name, err)
		}
		if !loaded {
			return "", fmt.Errorf("apparmor: localhost profile %q is not loaded", name)
		}
		return name, nil
	case kind == profileRuntimeDefault && enabled && !privileged:
		p, err := host.Default()
		if err != nil {
			return "", fmt.Errorf("apparmor: RuntimeDefault: %w", err)
		}
		return p, nil
	}
	return "", nil
}
