//lint:file-ignore SA1019 the deprecated apparmor_profile is part of what is tested

package spec

import (
	"errors"
	"slices"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeAppArmor is an AppArmor host with the given profiles loaded.
type fakeAppArmor struct {
	loaded     []string
	defaultErr error
}

func (f fakeAppArmor) Enabled() bool { return true }
func (f fakeAppArmor) Why() string   { return "" }
func (f fakeAppArmor) Default() (string, error) {
	return "berth-default", f.defaultErr
}
func (f fakeAppArmor) Loaded(name string) (bool, error) { return slices.Contains(f.loaded, name), nil }

func generateAppArmor(t *testing.T, host AppArmorHost, sc *runtimeapi.LinuxContainerSecurityContext) (string, error) {
	t.Helper()
	in := baseInput(t)
	in.AppArmor = host
	in.Config.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: sc}
	s, err := Generate(in)
	if err != nil {
		return "", err
	}
	return s.Process.ApparmorProfile, nil
}

func TestAppArmor(t *testing.T) {
	host := fakeAppArmor{loaded: []string{"berth-default", "deny-write"}}
	localhost := func(name string) *runtimeapi.SecurityProfile {
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: name}
	}
	unconfined := &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}
	for _, c := range []struct {
		name string
		host AppArmorHost
		sc   *runtimeapi.LinuxContainerSecurityContext
		want string
		err  []string
	}{
		{name: "unset", host: host, want: "berth-default"},
		{name: "runtime-default", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: &runtimeapi.SecurityProfile{}}, want: "berth-default"},
		{name: "deprecated-runtime-default", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{ApparmorProfile: "runtime/default"}, want: "berth-default"},
		{name: "unconfined", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: unconfined}, want: ""},
		{name: "deprecated-unconfined", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{ApparmorProfile: "unconfined"}, want: ""},
		{name: "localhost", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: localhost("deny-write")}, want: "deny-write"},
		{name: "localhost-prefixed", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: localhost("localhost/deny-write")}, want: "deny-write"},
		{name: "deprecated-localhost", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{ApparmorProfile: "localhost/deny-write"}, want: "deny-write"},
		{name: "new-field-wins", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: unconfined, ApparmorProfile: "localhost/deny-write"}, want: ""},
		{name: "privileged", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}, want: ""},
		{name: "privileged-localhost", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Privileged: true, Apparmor: localhost("deny-write")}, want: "deny-write"},
		{name: "not-loaded", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: localhost("ghost")}, err: []string{"apparmor", `"ghost"`, "not loaded"}},
		{name: "default-not-loaded", host: fakeAppArmor{defaultErr: errors.New("no apparmor_parser")}, err: []string{"apparmor", "RuntimeDefault", "no apparmor_parser"}},
		{name: "bad-deprecated", host: host, sc: &runtimeapi.LinuxContainerSecurityContext{ApparmorProfile: "deny-write"}, err: []string{"apparmor_profile", `"deny-write"`}},
		// A host without AppArmor: unconfined, and Localhost refused.
		{name: "no-apparmor-default", want: ""},
		{name: "no-apparmor-unconfined", sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: unconfined}, want: ""},
		{name: "no-apparmor-localhost", sc: &runtimeapi.LinuxContainerSecurityContext{Apparmor: localhost("deny-write")},
			err: []string{"apparmor", `"deny-write"`, "not enabled"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := generateAppArmor(t, c.host, c.sc)
			if c.err != nil {
				wantErr(t, err, c.err...)
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("profile %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestPauseAppArmor(t *testing.T) {
	host := fakeAppArmor{loaded: []string{"berth-default"}}
	if p, err := PauseAppArmor(nil, host); p != "berth-default" || err != nil {
		t.Errorf("unset: %q, %v", p, err)
	}
	if p, err := PauseAppArmor(&runtimeapi.LinuxSandboxSecurityContext{Privileged: true}, host); p != "" || err != nil {
		t.Errorf("privileged: %q, %v", p, err)
	}
	_, err := PauseAppArmor(&runtimeapi.LinuxSandboxSecurityContext{Apparmor: &runtimeapi.SecurityProfile{
		ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: "ghost"}}, nil)
	wantErr(t, err, `"ghost"`, "not enabled")
}
