package cri

import (
	_ "embed"
	"regexp"
	"strings"
)

// release is the version being worked towards, a semantic version; bump it
// in cri/VERSION when a release is cut.
//
//go:embed VERSION
var release string

// buildCommit is what `git describe` said of the tree berth was built from;
// the Makefile sets it with -ldflags "-X …/cri.buildCommit=…". Empty in plain
// `go build`s (tests).
var buildCommit string

// RuntimeVersion is berth's own version as the CRI Version call reports it
// and `kubectl describe node` shows it (berth://0.2.0-dev+3ce7510): the
// release with the commit as semver build metadata, so the kubelet parses it.
var RuntimeVersion = runtimeVersion(release, buildCommit)

// notMetadata is what semver build metadata ([0-9A-Za-z-] in dot-separated
// identifiers) cannot hold.
var notMetadata = regexp.MustCompile(`[^0-9A-Za-z.-]+`)

func runtimeVersion(release, commit string) string {
	v := strings.TrimSpace(release)
	meta := strings.Trim(notMetadata.ReplaceAllString(strings.TrimSpace(commit), "-"), ".")
	if meta == "" {
		return v
	}
	return v + "+" + meta
}
