//lint:file-ignore SA1019 the deprecated seccomp_profile_path is part of what is tested

package spec

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// allowed returns the rules that allow name (one per argument filter).
func allowed(p *specs.LinuxSeccomp, name string) []specs.LinuxSyscall {
	var out []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		if r.Action == specs.ActAllow && slices.Contains(r.Names, name) {
			out = append(out, r)
		}
	}
	return out
}

func generateSeccomp(t *testing.T, sc *runtimeapi.LinuxContainerSecurityContext) *specs.LinuxSeccomp {
	t.Helper()
	in := baseInput(t)
	in.Config.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: sc}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	return s.Linux.Seccomp
}

func TestSeccompRuntimeDefault(t *testing.T) {
	for _, sc := range []*runtimeapi.LinuxContainerSecurityContext{
		{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}},
		{SeccompProfilePath: "runtime/default"},
		{SeccompProfilePath: "docker/default"},
	} {
		p := generateSeccomp(t, sc)
		if p == nil {
			t.Fatalf("%v: no seccomp filter", sc)
		}
		if p.DefaultAction != specs.ActErrno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != 1 {
			t.Fatalf("default action %s errno %v, want SCMP_ACT_ERRNO with EPERM", p.DefaultAction, p.DefaultErrnoRet)
		}
		if runtime.GOARCH == "amd64" && !slices.Equal(p.Architectures, []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}) {
			t.Fatalf("architectures %v", p.Architectures)
		}
		for _, name := range []string{"read", "execve", "chmod", "socket", "chroot", "ptrace"} {
			if len(allowed(p, name)) == 0 {
				t.Errorf("%s is not allowed", name)
			}
		}
		for _, name := range []string{"keyctl", "add_key", "request_key", "bpf", "perf_event_open", "unshare", "setns",
			"mount", "umount2", "kexec_load", "kexec_file_load", "open_by_handle_at", "sethostname", "io_uring_setup",
			"userfaultfd", "init_module", "reboot", "clone3"} {
			if len(allowed(p, name)) != 0 {
				t.Errorf("%s is allowed with the default capabilities", name)
			}
		}
		clone := allowed(p, "clone")
		if len(clone) != 1 || len(clone[0].Args) != 1 || clone[0].Args[0].Op != specs.OpMaskedEqual || clone[0].Args[0].Value != 0x7E020000 {
			t.Fatalf("clone rules %+v, want one that masks the CLONE_NEW* flags", clone)
		}
	}
}

// With CAP_SYS_ADMIN the rules that capability guards come in and clone
// loses its flag filter.
func TestSeccompRuntimeDefaultCapabilities(t *testing.T) {
	p := generateSeccomp(t, &runtimeapi.LinuxContainerSecurityContext{
		Seccomp:      &runtimeapi.SecurityProfile{},
		Capabilities: &runtimeapi.Capability{AddCapabilities: []string{"SYS_ADMIN", "DAC_READ_SEARCH"}},
	})
	for _, name := range []string{"mount", "unshare", "setns", "sethostname", "clone3", "open_by_handle_at"} {
		if len(allowed(p, name)) == 0 {
			t.Errorf("%s is not allowed with CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH", name)
		}
	}
	clone := allowed(p, "clone")
	if len(clone) != 1 || len(clone[0].Args) != 0 {
		t.Fatalf("clone rules %+v, want one without argument filter", clone)
	}
	if slices.ContainsFunc(p.Syscalls, func(r specs.LinuxSyscall) bool {
		return slices.Contains(r.Names, "clone3") && r.Action != specs.ActAllow
	}) {
		t.Fatal("clone3 still answers ENOSYS with CAP_SYS_ADMIN")
	}
}

func TestSeccompNone(t *testing.T) {
	for _, sc := range []*runtimeapi.LinuxContainerSecurityContext{
		nil,
		{},
		{SeccompProfilePath: "unconfined"},
		{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}},
		// The new field wins over the deprecated one.
		{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}, SeccompProfilePath: "runtime/default"},
		{Privileged: true, Seccomp: &runtimeapi.SecurityProfile{}},
		{Privileged: true, Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: "/nonexistent.json"}},
	} {
		if p := generateSeccomp(t, sc); p != nil {
			t.Errorf("%v: seccomp %+v, want none", sc, p)
		}
	}
}

const ociChmodProfile = `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
	{"names": ["chmod", "fchmod", "fchmodat", "fchmodat2"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}`

func TestSeccompLocalhost(t *testing.T) {
	file := filepath.Join(t.TempDir(), "chmod.json")
	writeFile(t, file, ociChmodProfile)
	for _, sc := range []*runtimeapi.LinuxContainerSecurityContext{
		{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: file}},
		{SeccompProfilePath: "localhost/" + file},
		{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: file}, SeccompProfilePath: "unconfined"},
	} {
		p := generateSeccomp(t, sc)
		if p == nil || p.DefaultAction != specs.ActAllow || len(p.Syscalls) != 1 || p.Syscalls[0].Action != specs.ActErrno ||
			!slices.Contains(p.Syscalls[0].Names, "fchmodat") {
			t.Fatalf("%v: seccomp %+v", sc, p)
		}
	}
}

func TestSeccompErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.json")
	broken := filepath.Join(dir, "broken.json")
	writeFile(t, broken, `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [`)
	badAction := filepath.Join(dir, "action.json")
	writeFile(t, badAction, `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["chmod"], "action": "SCMP_ACT_NOPE"}]}`)
	empty := filepath.Join(dir, "empty.json")
	writeFile(t, empty, `{}`)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	localhost := func(ref string) *runtimeapi.SecurityProfile {
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: ref}
	}
	for _, tc := range []struct {
		sc  *runtimeapi.LinuxContainerSecurityContext
		err []string
	}{
		{&runtimeapi.LinuxContainerSecurityContext{Seccomp: localhost(missing)}, []string{"seccomp", missing, "no such file"}},
		{&runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "localhost/" + missing}, []string{missing, "no such file"}},
		{&runtimeapi.LinuxContainerSecurityContext{Seccomp: localhost(broken)}, []string{broken, "unexpected end of JSON"}},
		{&runtimeapi.LinuxContainerSecurityContext{Seccomp: localhost(badAction)}, []string{badAction, "SCMP_ACT_NOPE"}},
		{&runtimeapi.LinuxContainerSecurityContext{Seccomp: localhost(empty)}, []string{empty, "no defaultAction"}},
		{&runtimeapi.LinuxContainerSecurityContext{Seccomp: localhost("relative.json")}, []string{`"relative.json"`, "absolute"}},
		{&runtimeapi.LinuxContainerSecurityContext{Seccomp: localhost("")}, []string{"seccomp", "localhost_ref"}},
		{&runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "bogus"}, []string{"seccomp_profile_path", `"bogus"`}},
		{&runtimeapi.LinuxContainerSecurityContext{Seccomp: &runtimeapi.SecurityProfile{ProfileType: 7}}, []string{"seccomp", "profile type"}},
	} {
		in := baseInput(t)
		in.Config.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: tc.sc}
		_, err := Generate(in)
		wantErr(t, err, tc.err...)
	}
}

// The pause's filter follows the pod's field, resolved without capabilities.
func TestPauseSeccomp(t *testing.T) {
	p, err := PauseSeccomp(&runtimeapi.LinuxSandboxSecurityContext{Seccomp: &runtimeapi.SecurityProfile{}})
	if err != nil || p == nil || len(allowed(p, "read")) == 0 || len(allowed(p, "chroot")) != 0 {
		t.Fatalf("RuntimeDefault for the pause: %+v, %v", p, err)
	}
	for _, sc := range []*runtimeapi.LinuxSandboxSecurityContext{nil, {Privileged: true, Seccomp: &runtimeapi.SecurityProfile{}}} {
		if p, err := PauseSeccomp(sc); p != nil || err != nil {
			t.Errorf("%v: %+v, %v; want no filter", sc, p, err)
		}
	}
	_, err = PauseSeccomp(&runtimeapi.LinuxSandboxSecurityContext{SeccompProfilePath: "localhost/relative"})
	wantErr(t, err, `"relative"`, "absolute")
}
