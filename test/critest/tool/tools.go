//go:build tools

// Package tool keeps cri-tools' validation suite in this module's build
// list: critest itself is a test binary (its package has only test files).
package tool

import _ "sigs.k8s.io/cri-tools/pkg/validate"
