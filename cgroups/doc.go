// Package cgroups owns the pod and container cgroup tree, maps CRI resources to
// cgroup settings and reads stats and OOM events back.
//
// The host's mode (v1 legacy/hybrid or v2 unified) is detected once in New.
// This package creates and removes pod cgroups itself; container cgroups are
// created by runc from ContainerCgroupsPath and SpecResources, below the pod's.
// Both go through opencontainers/cgroups, so a pod and its containers are
// configured by the same code (cgroupfs or systemd driver).
package cgroups
