// Package spec turns one CRI container (its config, its pod's config and its
// image's config) into the OCI runtime spec that the shim hands to runc's
// libcontainer (through specconv).
//
// The package is pure: it reads the container's rootfs (/etc/passwd,
// /etc/group), stats host paths named by mounts and devices and reads
// /proc/sys/kernel/cap_last_cap, but it never changes anything on the host.
package spec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/cdi"
	"github.com/berth-runtime/berth/sandbox/shim"
)

// Annotations berth adds to every spec (the names containerd uses, so that
// tools that read them keep working).
const (
	AnnotationContainerType    = "io.kubernetes.cri.container-type"
	AnnotationContainerName    = "io.kubernetes.cri.container-name"
	AnnotationImageName        = "io.kubernetes.cri.image-name"
	AnnotationSandboxName      = "io.kubernetes.cri.sandbox-name"
	AnnotationSandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	AnnotationSandboxUID       = "io.kubernetes.cri.sandbox-uid"
	ContainerTypeContainer     = "container"
)

// CheckReservedAnnotations refuses annotations only berth may set; field
// names them in the error ("config.annotations").
func CheckReservedAnnotations(field string, annotations map[string]string) error {
	if _, ok := annotations[shim.AnnotationCRIUConfig]; ok {
		return fmt.Errorf("%s: %s is berth's: CRIU's configuration is the node's, not a pod's to choose", field, shim.AnnotationCRIUConfig)
	}
	return nil
}

// Input gathers everything the spec needs; the sandbox manager fills it.
//
// Namespaces: for network, IPC and PID a non-empty path is joined, the
// matching Host* flag shares the host's namespace (the kind is left out of the
// spec), and neither gives the container a new private namespace. Setting both
// a path and the Host* flag is an error. UTS follows the network: UTSNS is
// joined when set, else HostNet shares the host's, else a new one.
type Input struct {
	ContainerID string
	PodID       string // the sandbox's ID: the bound on hung host-path lookups is the pod's
	Config      *runtimeapi.ContainerConfig
	Pod         *runtimeapi.PodSandboxConfig
	Image       ocispec.ImageConfig // Entrypoint, Cmd, Env, WorkingDir, User, StopSignal
	RootfsPath  string              // the mounted overlay (merged dir); also read for /etc/passwd and /etc/group

	NetNS, IPCNS, UTSNS string // pinned namespace files of the pod to join
	PIDNS               string // /proc/<pause pid>/ns/pid when the pod shares one PID namespace

	HostPID, HostIPC, HostNet bool

	// Pod files bind-mounted to /etc/hosts, /etc/resolv.conf, /etc/hostname
	// and /dev/shm. An empty path leaves that file out, except ShmPath: ""
	// gives a private 64M tmpfs (or the host's /dev/shm with HostIPC).
	HostsPath, ResolvPath, HostnamePath, ShmPath string

	CgroupsPath string                // linux.cgroupsPath, given by the cgroups package
	Resources   *specs.LinuxResources // from the cgroups package (may be nil)

	AppArmor AppArmorHost // nil: the host has no AppArmor

	// UserNS is the pod's user namespace (a pin) to join, with its
	// mappings; the CRI mounts are then idmapped through them. Empty: the
	// host's.
	UserNS                   string
	UIDMappings, GIDMappings []specs.LinuxIDMapping

	// ImageVolumes maps the index in Config.Mounts of each image mount to
	// where the sandbox mounted its image, read-only (idmapped in a user
	// namespace).
	ImageVolumes map[int]string

	// CDI resolves the CDI devices the container asks for; nil knows none.
	CDI *cdi.Registry

	// CRIUConfig is the file the container's checkpoints take CRIU's
	// configuration from (shim.AnnotationCRIUConfig).
	CRIUConfig string
}

// Generate builds the OCI runtime spec for one CRI container. Errors name the
// offending CRI field or value; nothing on the host is changed.
func Generate(in Input) (*specs.Spec, error) {
	cfg := in.Config
	if cfg == nil {
		return nil, errors.New("container config is required")
	}
	if in.RootfsPath == "" || !filepath.IsAbs(in.RootfsPath) {
		return nil, fmt.Errorf("rootfs path %q must be absolute", in.RootfsPath)
	}
	sc := cfg.GetLinux().GetSecurityContext()
	privileged := sc.GetPrivileged()

	process, err := buildProcess(in)
	if err != nil {
		return nil, err
	}
	user, err := ResolveUser(in.RootfsPath, in.Image, sc)
	if err != nil {
		return nil, err
	}
	process.User = user
	process.NoNewPrivileges = sc.GetNoNewPrivs()
	if process.ApparmorProfile, err = buildAppArmor(sc, in.AppArmor); err != nil {
		return nil, err
	}
	if process.Capabilities, err = capabilities(sc); err != nil {
		return nil, err
	}
	if r := cfg.GetLinux().GetResources(); r != nil {
		adj := int(r.GetOomScoreAdj())
		process.OOMScoreAdj = &adj
	}

	namespaces, hostUTS, err := buildNamespaces(in, privileged)
	if err != nil {
		return nil, err
	}
	sysctls, err := buildSysctls(in, hostUTS)
	if err != nil {
		return nil, err
	}
	mounts, rootPropagation, err := buildMounts(in, sc)
	if err != nil {
		return nil, err
	}
	devices, deviceRules, err := buildDevices(in.PodID, cfg.GetDevices(), privileged)
	if err != nil {
		return nil, err
	}

	s := &specs.Spec{
		Version:     specs.Version,
		Process:     process,
		Root:        &specs.Root{Path: in.RootfsPath, Readonly: sc.GetReadonlyRootfs()},
		Mounts:      mounts,
		Annotations: buildAnnotations(in),
		Linux: &specs.Linux{
			Sysctl:            sysctls,
			Resources:         mergeResources(in.Resources, deviceRules),
			CgroupsPath:       in.CgroupsPath,
			Namespaces:        namespaces,
			Devices:           devices,
			RootfsPropagation: rootPropagation,
		},
	}
	if !hostUTS {
		s.Hostname = in.Pod.GetHostname()
	}
	if !privileged {
		s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = procPaths(sc, in.UserNS != "")
	}
	if s.Linux.Seccomp, err = buildSeccomp(sc, s); err != nil {
		return nil, err
	}
	if in.UserNS != "" {
		JoinUserNS(s, in.UserNS, in.UIDMappings, in.GIDMappings)
	}
	// Last: CDI edits go on top of berth's own devices and mounts (adding
	// their device cgroup rules after the defaults), and its mounts are
	// idmapped when the spec has a user namespace.
	if err := injectCDI(in, s); err != nil {
		return nil, err
	}
	return s, nil
}

// JoinUserNS puts the process of s in the user namespace pinned at pin;
// libcontainer wants the namespace's mappings too, and checks them.
func JoinUserNS(s *specs.Spec, pin string, uids, gids []specs.LinuxIDMapping) {
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: pin})
	s.Linux.UIDMappings, s.Linux.GIDMappings = uids, gids
}

// buildNamespaces returns the namespaces of the spec and whether the
// container shares the host's UTS namespace.
func buildNamespaces(in Input, privileged bool) ([]specs.LinuxNamespace, bool, error) {
	ns := []specs.LinuxNamespace{{Type: specs.MountNamespace}}
	add := func(kind specs.LinuxNamespaceType, path string, host bool, field string) error {
		switch {
		case path != "" && host:
			return fmt.Errorf("%s namespace: both a path to join (%s) and the host's namespace requested", field, path)
		case path != "":
			ns = append(ns, specs.LinuxNamespace{Type: kind, Path: path})
		case !host:
			ns = append(ns, specs.LinuxNamespace{Type: kind})
		}
		return nil
	}
	if err := add(specs.NetworkNamespace, in.NetNS, in.HostNet, "network"); err != nil {
		return nil, false, err
	}
	if err := add(specs.IPCNamespace, in.IPCNS, in.HostIPC, "ipc"); err != nil {
		return nil, false, err
	}
	if err := add(specs.PIDNamespace, in.PIDNS, in.HostPID, "pid"); err != nil {
		return nil, false, err
	}
	hostUTS := in.UTSNS == "" && in.HostNet
	if err := add(specs.UTSNamespace, in.UTSNS, hostUTS, "uts"); err != nil {
		return nil, false, err
	}
	if !privileged {
		ns = append(ns, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}
	return ns, hostUTS, nil
}

func buildAnnotations(in Input) map[string]string {
	a := make(map[string]string, len(in.Config.GetAnnotations())+6)
	for k, v := range in.Config.GetAnnotations() {
		a[k] = v
	}
	a[AnnotationContainerType] = ContainerTypeContainer
	a[shim.AnnotationCRIUConfig] = in.CRIUConfig
	if name := in.Config.GetMetadata().GetName(); name != "" {
		a[AnnotationContainerName] = name
	}
	if image := in.Config.GetImage().GetImage(); image != "" {
		a[AnnotationImageName] = image
	}
	if md := in.Pod.GetMetadata(); md != nil {
		a[AnnotationSandboxName] = md.GetName()
		a[AnnotationSandboxNamespace] = md.GetNamespace()
		a[AnnotationSandboxUID] = md.GetUid()
	}
	return a
}

// mergeResources copies the cgroups package's resources (the pointers inside
// are shared, not copied) and puts the device rules in front of any it had.
func mergeResources(r *specs.LinuxResources, rules []specs.LinuxDeviceCgroup) *specs.LinuxResources {
	var out specs.LinuxResources
	if r != nil {
		out = *r
		rules = append(rules, r.Devices...)
	}
	out.Devices = rules
	return &out
}

// hostHostname is os.Hostname, replaceable in tests.
var hostHostname = os.Hostname
