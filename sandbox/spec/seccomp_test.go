//lint:file-ignore SA1019 the deprecated seccomp_profile_path is part of what is tested

package spec

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/moby/profiles/seccomp"
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
		for _, name := range []string{"read", "execve", "chmod", "socket", "chroot", "ptrace", "pipe", "pipe2"} {
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

// defaultBounding is the bounding set berth gives a container that asks for
// no capabilities.
func defaultBounding(t *testing.T) []string {
	t.Helper()
	s, err := Generate(baseInput(t))
	if err != nil {
		t.Fatal(err)
	}
	return s.Process.Capabilities.Bounding
}

// berthDefaultProfile is the embedded RuntimeDefault profile, unresolved.
func berthDefaultProfile(t *testing.T) *seccomp.Seccomp {
	t.Helper()
	var p seccomp.Seccomp
	if err := json.Unmarshal([]byte(defaultSeccompProfile), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// resolveFor picks the rules of a Docker-format profile that apply to a
// process with the bounding set caps on arch (Go's name), by the rules of
// moby/profiles' loader, which can only resolve for the architecture it runs
// on. Every minKernel is taken as met: berth needs kernels far newer than
// the 4.8 the profiles name.
func resolveFor(p *seccomp.Seccomp, arch string, caps []string) []specs.LinuxSyscall {
	var out []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		if x := r.Excludes; x != nil && (slices.Contains(x.Arches, arch) ||
			slices.ContainsFunc(x.Caps, func(c string) bool { return slices.Contains(caps, c) })) {
			continue
		}
		if in := r.Includes; in != nil && (len(in.Arches) > 0 && !slices.Contains(in.Arches, arch) ||
			slices.ContainsFunc(in.Caps, func(c string) bool { return !slices.Contains(caps, c) })) {
			continue
		}
		out = append(out, r.LinuxSyscall)
	}
	return out
}

// argMatches reports whether v passes the comparison a.
func argMatches(a specs.LinuxSeccompArg, v uint64) bool {
	switch a.Op {
	case specs.OpNotEqual:
		return v != a.Value
	case specs.OpLessThan:
		return v < a.Value
	case specs.OpLessEqual:
		return v <= a.Value
	case specs.OpEqualTo:
		return v == a.Value
	case specs.OpGreaterEqual:
		return v >= a.Value
	case specs.OpGreaterThan:
		return v > a.Value
	case specs.OpMaskedEqual:
		return v&a.Value == a.ValueTwo
	}
	return false
}

// allowsCall reports whether rules allow name called with argument index
// set to v (index -1: with any arguments, that is, unconditionally).
func allowsCall(rules []specs.LinuxSyscall, name string, index int, v uint64) bool {
	return slices.ContainsFunc(rules, func(r specs.LinuxSyscall) bool {
		if r.Action != specs.ActAllow || !slices.Contains(r.Names, name) {
			return false
		}
		for _, a := range r.Args {
			if int(a.Index) != index || !argMatches(a, v) {
				return false
			}
		}
		return true
	})
}

// notAllowedBy lists what from allows and to does not: calls by name, and
// calls whose argument filters let through a value to refuses
// ("socket(arg0=38)"). The values tried are those either side names, their
// neighbours and their single bits, which is where two filters can differ.
func notAllowedBy(from, to []specs.LinuxSyscall) []string {
	var out []string
	for _, r := range from {
		if r.Action != specs.ActAllow {
			continue
		}
		for _, name := range r.Names {
			if len(r.Args) == 0 {
				if !allowsCall(to, name, -1, 0) && !slices.Contains(out, name) {
					out = append(out, name)
				}
				continue
			}
			index := int(r.Args[0].Index)
			for _, v := range argValuesTried(name, from, to) {
				if allowsCall(from, name, index, v) && !allowsCall(to, name, index, v) {
					if miss := fmt.Sprintf("%s(arg%d=%d)", name, index, v); !slices.Contains(out, miss) {
						out = append(out, miss)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func argValuesTried(name string, profiles ...[]specs.LinuxSyscall) []uint64 {
	vs := []uint64{0}
	for _, rules := range profiles {
		for _, r := range rules {
			if !slices.Contains(r.Names, name) {
				continue
			}
			for _, a := range r.Args {
				vs = append(vs, a.Value, a.Value-1, a.Value+1)
				for bit := uint64(1); bit != 0; bit <<= 1 {
					if a.Op == specs.OpMaskedEqual && a.Value&bit != 0 {
						vs = append(vs, bit)
					}
				}
			}
		}
	}
	slices.Sort(vs)
	return slices.Compact(vs)
}

// deniedOnPurpose are the calls that Docker's maintained default profile
// allows and berth's refuses, each with the reason. None today: keep it so.
var deniedOnPurpose = map[string]string{}

// containerdAlsoAllows are the calls containerd's default profile
// (github.com/containerd/containerd/v2/contrib/seccomp, v2.4.2) allows to
// every container beyond Docker's: the LSM attribute calls, which Docker
// keeps for CAP_SYS_ADMIN. They do what /proc/self/attr already lets a
// process do to itself. containerd is not a dependency for three names.
var containerdAlsoAllows = []string{"lsm_get_self_attr", "lsm_list_modules", "lsm_set_self_attr"}

// TestSeccompDefaultCoversDocker compares berth's RuntimeDefault with the
// default profile Docker maintains (moby/profiles, the source containerd's
// is derived from), resolved alike for a container with berth's default
// capabilities on amd64 and arm64: every call, and every argument value,
// that Docker's lets through must pass berth's, or be in deniedOnPurpose.
// What berth allows beyond Docker is logged, for review.
func TestSeccompDefaultCoversDocker(t *testing.T) {
	caps := defaultBounding(t)
	berth, docker := berthDefaultProfile(t), seccomp.DefaultProfile()
	for _, arch := range []string{"amd64", "arm64"} {
		b, d := resolveFor(berth, arch, caps), resolveFor(docker, arch, caps)
		for _, call := range notAllowedBy(d, b) {
			if reason, ok := deniedOnPurpose[call]; ok {
				t.Logf("%s: %s is denied on purpose: %s", arch, call, reason)
				continue
			}
			t.Errorf("%s: Docker's default profile allows %s, berth's RuntimeDefault denies it", arch, call)
		}
		for _, name := range containerdAlsoAllows {
			if !allowsCall(b, name, -1, 0) {
				t.Errorf("%s: containerd's default profile allows %s, berth's RuntimeDefault denies it", arch, name)
			}
		}
		if beyond := notAllowedBy(b, d); len(beyond) > 0 {
			t.Logf("%s: berth's RuntimeDefault allows beyond Docker's: %s", arch, strings.Join(beyond, " "))
		}
	}
	for name := range deniedOnPurpose {
		if allowsCall(resolveFor(berth, runtime.GOARCH, caps), name, -1, 0) {
			t.Errorf("%s is listed as denied on purpose but berth allows it", name)
		}
	}
}

// linuxSyscallNames reads the system call names of every Linux architecture
// from golang.org/x/sys's tables (unix/zsysnum_linux_*.go, generated from
// the kernel's headers).
func linuxSyscallNames(t *testing.T) map[string]bool {
	t.Helper()
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "golang.org/x/sys").Output()
	if err != nil {
		t.Fatalf("go list golang.org/x/sys: %v", err)
	}
	files, err := filepath.Glob(filepath.Join(strings.TrimSpace(string(dir)), "unix", "zsysnum_linux_*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no system call tables in golang.org/x/sys: %v", err)
	}
	names := map[string]bool{}
	sysConst := regexp.MustCompile(`(?m)^\s*SYS_(\w+)\s*=\s*\d+`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range sysConst.FindAllSubmatch(b, -1) {
			names[strings.ToLower(string(m[1]))] = true
		}
	}
	return names
}

// notInSyscallTables are names of berth's profile that x/sys's tables lack,
// each with what it is.
var notInSyscallTables = map[string]string{
	"breakpoint": "32-bit ARM's private call __ARM_NR_breakpoint (0xf0001), which libseccomp names",
	"set_tls":    "32-bit ARM's private call __ARM_NR_set_tls (0xf0005), which libseccomp names",
}

// libseccomp (and so the shim) drops a name it cannot resolve without an
// error, so a misspelt name in the profile would quietly refuse the call it
// meant. Every name must be a system call of some Linux architecture.
func TestSeccompDefaultNamesAreSyscalls(t *testing.T) {
	known := linuxSyscallNames(t)
	for _, r := range berthDefaultProfile(t).Syscalls {
		for _, name := range r.Names {
			if !known[name] && notInSyscallTables[name] == "" {
				t.Errorf("%q is not a Linux system call", name)
			}
		}
	}
}
