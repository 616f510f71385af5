package cri

import (
	"regexp"
	"testing"
)

// semver is the grammar of semver.org 2.0.0, which the kubelet's parser follows.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

func TestRuntimeVersionIsSemver(t *testing.T) {
	for _, c := range []struct{ commit, want string }{
		{"", "0.2.0-dev"},
		{"3ce7510", "0.2.0-dev+3ce7510"},
		{"3ce7510-dirty\n", "0.2.0-dev+3ce7510-dirty"},
		{"v0.1.0-5-gabc1234", "0.2.0-dev+v0.1.0-5-gabc1234"},
		{"heads/main_x", "0.2.0-dev+heads-main-x"},
	} {
		got := runtimeVersion("0.2.0-dev\n", c.commit)
		if got != c.want || !semver.MatchString(got) {
			t.Errorf("runtimeVersion(%q) = %q, want %q (semver)", c.commit, got, c.want)
		}
	}
	if !semver.MatchString(RuntimeVersion) {
		t.Errorf("RuntimeVersion %q is not a semantic version", RuntimeVersion)
	}
}
