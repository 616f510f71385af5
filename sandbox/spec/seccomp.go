package spec

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// defaultSeccompProfile is berth's RuntimeDefault seccomp profile, in the
// Docker format (rules conditional on capabilities, architecture and kernel);
// docs/seccomp.md says where it comes from and how to change it. It allows
// at least what Docker's maintained default profile allows
// (TestSeccompDefaultCoversDocker).
//
// A name the shim's libseccomp cannot resolve (a call newer than the
// library) does not reach the filter: libcontainer leaves it out, and its
// filter answers ENOSYS, not EPERM, for every call numbered past the last
// one it names, so a program sees a kernel without that call and takes its
// fallback (TestSeccompRuntimeDefaultRunsPrograms checks the answers).
//
//go:embed profiles/seccomp-default.json
var defaultSeccompProfile string

// profileKind is what a CRI security profile field asks for.
type profileKind int

const (
	profileUnconfined profileKind = iota
	profileRuntimeDefault
	profileLocalhost
)

// pickProfile reads a security profile from the CRI's field (which wins when
// set) or its deprecated string form ("runtime/default", "unconfined",
// "localhost/<ref>" and the names in alsoDefault). unset is the kind when
// neither is given. It returns the kind and, for Localhost, the reference.
func pickProfile(field string, p *runtimeapi.SecurityProfile, deprecatedField, deprecated string, unset profileKind, alsoDefault ...string) (profileKind, string, error) {
	if p != nil {
		switch p.GetProfileType() {
		case runtimeapi.SecurityProfile_RuntimeDefault:
			return profileRuntimeDefault, "", nil
		case runtimeapi.SecurityProfile_Unconfined:
			return profileUnconfined, "", nil
		case runtimeapi.SecurityProfile_Localhost:
			if p.GetLocalhostRef() == "" {
				return 0, "", fmt.Errorf("%s: localhost_ref is required with profile type Localhost", field)
			}
			return profileLocalhost, p.GetLocalhostRef(), nil
		}
		return 0, "", fmt.Errorf("%s: unknown profile type %v", field, p.GetProfileType())
	}
	switch {
	case deprecated == "":
		return unset, "", nil
	case deprecated == "unconfined":
		return profileUnconfined, "", nil
	case deprecated == "runtime/default" || slices.Contains(alsoDefault, deprecated):
		return profileRuntimeDefault, "", nil
	case strings.HasPrefix(deprecated, "localhost/") && len(deprecated) > len("localhost/"):
		return profileLocalhost, strings.TrimPrefix(deprecated, "localhost/"), nil
	}
	return 0, "", fmt.Errorf("%s %q: want runtime/default, unconfined or localhost/<profile>", deprecatedField, deprecated)
}

// buildSeccomp returns the container's seccomp filter: none when privileged,
// unconfined or unset; berth's default profile for RuntimeDefault (and the
// deprecated runtime/default and docker/default); for Localhost the JSON
// profile (OCI or Docker format) at the absolute host path given, read now so
// that a missing or broken file fails CreateContainer. Rules conditional on
// capabilities are resolved against the container's bounding set.
func buildSeccomp(sc *runtimeapi.LinuxContainerSecurityContext, s *specs.Spec) (*specs.LinuxSeccomp, error) {
	//lint:ignore SA1019 kubelets still send the deprecated field
	return seccompFor(sc.GetSeccomp(), sc.GetSeccompProfilePath(), sc.GetPrivileged(), s)
}

// PauseSeccomp returns the filter of a pod's pause process from the pod's
// security context, by the rules of buildSeccomp, resolved for a process
// without capabilities (the pause needs none of the calls they allow).
func PauseSeccomp(sc *runtimeapi.LinuxSandboxSecurityContext) (*specs.LinuxSeccomp, error) {
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	//lint:ignore SA1019 kubelets still send the deprecated field
	return seccompFor(sc.GetSeccomp(), sc.GetSeccompProfilePath(), sc.GetPrivileged(), s)
}

func seccompFor(p *runtimeapi.SecurityProfile, deprecated string, privileged bool, s *specs.Spec) (*specs.LinuxSeccomp, error) {
	kind, ref, err := pickProfile("seccomp", p, "seccomp_profile_path", deprecated, profileUnconfined, "docker/default")
	if err != nil || privileged {
		return nil, err
	}
	switch kind {
	case profileRuntimeDefault:
		return loadSeccomp(defaultSeccompProfile, s)
	case profileLocalhost:
		if !filepath.IsAbs(ref) {
			return nil, fmt.Errorf("seccomp: localhost profile %q must be an absolute path", ref)
		}
		b, err := os.ReadFile(ref)
		if err != nil {
			return nil, fmt.Errorf("seccomp: localhost profile %q: %w", ref, err)
		}
		p, err := loadSeccomp(string(b), s)
		if err != nil {
			return nil, fmt.Errorf("seccomp: localhost profile %q: %w", ref, err)
		}
		return p, nil
	}
	return nil, nil
}

// seccompActions are the actions the OCI runtime spec (and runc) knows but
// SCMP_ACT_NOTIFY: berth runs no seccomp agent to answer it.
var seccompActions = []specs.LinuxSeccompAction{
	specs.ActKill, specs.ActKillProcess, specs.ActKillThread, specs.ActTrap, specs.ActErrno,
	specs.ActTrace, specs.ActAllow, specs.ActLog,
}

// seccompOperators are the argument comparisons the OCI runtime spec knows.
var seccompOperators = []specs.LinuxSeccompOperator{
	specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual, specs.OpEqualTo,
	specs.OpGreaterEqual, specs.OpGreaterThan, specs.OpMaskedEqual,
}

// loadSeccomp parses a profile and checks what the shim would otherwise
// only find out at create: a known default action, known rule actions and
// operators, and at least one syscall name per rule.
func loadSeccomp(body string, s *specs.Spec) (*specs.LinuxSeccomp, error) {
	p, err := seccomp.LoadProfile(body, s)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("no defaultAction and no syscalls")
	}
	if !slices.Contains(seccompActions, p.DefaultAction) {
		return nil, fmt.Errorf("defaultAction %q: unknown or unsupported action", p.DefaultAction)
	}
	for i, r := range p.Syscalls {
		if len(r.Names) == 0 {
			return nil, fmt.Errorf("syscalls[%d]: no names", i)
		}
		if !slices.Contains(seccompActions, r.Action) {
			return nil, fmt.Errorf("syscalls[%d] (%s): action %q: unknown or unsupported action", i, r.Names[0], r.Action)
		}
		for _, a := range r.Args {
			if !slices.Contains(seccompOperators, a.Op) {
				return nil, fmt.Errorf("syscalls[%d] (%s): op %q: unknown operator", i, r.Names[0], a.Op)
			}
		}
	}
	return p, nil
}
