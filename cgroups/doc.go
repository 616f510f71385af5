// Package cgroups owns the pod and container cgroup tree, maps CRI resources to
// cgroup settings and reads stats and OOM events back.
package cgroups
