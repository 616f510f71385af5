//go:build tools

package cluster

// The e2e tier runs Kubernetes' own e2e suite, e2e.test, which `make` builds
// with `go test -c k8s.io/kubernetes/test/e2e` into bin/cluster/. A test
// binary of a dependency is no tool the tool directive can name, so this file
// (never compiled: the tools tag) imports the suite, and `go mod tidy` keeps
// the requirements and sums that building it needs.
import (
	_ "k8s.io/kubernetes/test/e2e"
)
