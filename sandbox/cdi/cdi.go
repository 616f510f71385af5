// Package cdi resolves Container Device Interface device names
// ("vendor.com/class=name") against the CDI spec folders and applies what
// their specs say (device nodes with their device cgroup rules, mounts,
// environment, hooks, additional groups) to a container's OCI spec. It is
// the one place berth reads CDI specs; the parsing and the edits are the
// maintained CDI library's, as in containerd and CRI-O.
package cdi

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/berth-runtime/berth/cri/errkind"
)

// Registry is the CDI devices of a set of spec folders.
type Registry struct {
	dirs  []string
	cache *cdiapi.Cache // nil: no folders, no devices
}

// New returns the registry of the spec folders dirs, later ones winning
// over earlier ones for a device both define (the CDI priority order).
// Folders that do not exist yet are fine: a driver may make them later.
//
// The cache is rescanned on every use instead of watched with fsnotify:
// the folders hold a few small files, they are read only when a container
// asks for CDI devices (or `berthctl info` lists them), and a rescan can
// never miss a change the way a watch can when a folder appears after
// berthd started or an event queue overflows; nor does it need a goroutine.
func New(dirs []string) *Registry {
	r := &Registry{dirs: slices.Clone(dirs)}
	if len(dirs) > 0 {
		// Never an error: NewCache keeps its signature for old callers.
		r.cache, _ = cdiapi.NewCache(cdiapi.WithSpecDirs(dirs...), cdiapi.WithAutoRefresh(false))
	}
	return r
}

// Devices lists the qualified names of the devices the spec folders define
// now, sorted.
func (r *Registry) Devices() []string {
	if r == nil || r.cache == nil {
		return nil
	}
	_ = r.cache.Refresh() // a broken spec file leaves out its devices only
	return r.cache.ListDevices()
}

// Inject applies the edits of the named devices to s. A device no spec
// folder defines is FailedPrecondition naming it (and the spec files that
// failed to load, one of which may have meant to define it). On an error s
// may be partly edited: the caller drops it.
func (r *Registry) Inject(s *specs.Spec, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	if r == nil || r.cache == nil {
		return errkind.Errorf(errkind.FailedPrecondition, "CDI devices %s: no CDI spec folders are configured ([cdi] spec_dirs)",
			strings.Join(devices, ", "))
	}
	_ = r.cache.Refresh() // load errors are reported below, with a device they may explain
	unresolved, err := r.cache.InjectDevices(s, devices...)
	if len(unresolved) > 0 {
		return errkind.Errorf(errkind.FailedPrecondition, "CDI devices %s: not defined by any spec in %s%s",
			strings.Join(unresolved, ", "), strings.Join(r.dirs, ", "), r.loadErrors())
	}
	if err != nil {
		// A spec the library loaded but cannot apply (a device node
		// missing on the host): the node's setup, not the request.
		return errkind.Errorf(errkind.FailedPrecondition, "CDI devices %s: %w", strings.Join(devices, ", "), err)
	}
	return refuseUnsupported(s, devices)
}

// refuseUnsupported refuses edits berth cannot honour in a pod's container:
// network devices (the container shares its pod's network namespace, which
// the pod network owns) and Intel RDT (berth sets no resctrl groups).
func refuseUnsupported(s *specs.Spec, devices []string) error {
	if s.Linux == nil {
		return nil
	}
	if len(s.Linux.NetDevices) > 0 {
		return errkind.Errorf(errkind.FailedPrecondition, "CDI devices %s: the spec moves network devices into the container, which berth does not support",
			strings.Join(devices, ", "))
	}
	if s.Linux.IntelRdt != nil {
		return errkind.Errorf(errkind.FailedPrecondition, "CDI devices %s: the spec sets Intel RDT, which berth does not support",
			strings.Join(devices, ", "))
	}
	return nil
}

// loadErrors is "" or " (spec errors: FILE: ERROR; ...)", by file.
func (r *Registry) loadErrors() string {
	byPath := r.cache.GetErrors()
	var all []string
	for _, p := range slices.Sorted(maps.Keys(byPath)) {
		for _, err := range byPath[p] {
			all = append(all, fmt.Sprintf("%s: %v", p, err))
		}
	}
	if len(all) == 0 {
		return ""
	}
	return " (spec errors: " + strings.Join(all, "; ") + ")"
}
