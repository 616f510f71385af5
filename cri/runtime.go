// Package cri serves the Kubernetes CRI (runtime.v1) and berth's own small
// extension service on berthd's unix socket: request validation, mapping CRI ⇄
// internal types and gRPC error codes. It never touches the kernel itself.
package cri

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/image/registry"
	"github.com/berth-runtime/berth/sandbox"
)

const (
	// kubeAPIVersion is the "version" field of VersionResponse: the version of
	// the kubelet runtime API, which every upstream runtime reports as 0.1.0.
	kubeAPIVersion    = "0.1.0"
	runtimeName       = "berth"
	runtimeAPIVersion = "v1"
)

// Config is the part of berthd's configuration the runtime service reports.
type Config struct {
	Root string
	// ContainerRoot holds the writable layers ([storage] container_root,
	// or Root).
	ContainerRoot string
	State         string
	Socket        string
	CgroupDriver  string // "cgroupfs" or "systemd"
	// NetworkMode ("bridge", "cni") and MetricsAddress ("" when off) are
	// shown in verbose Status.
	NetworkMode, MetricsAddress string
	// GzipDecoder names the decoder of gzip layers and why it was chosen.
	GzipDecoder string
	// Registries is shown in verbose Status without credentials.
	Registries map[string]registry.Host
	// Logger takes what a call reports past instead of failing (one
	// container's unreadable stats); nil is slog.Default().
	Logger *slog.Logger
}

// RuntimeService is the CRI RuntimeService. Calls not implemented yet answer
// codes.Unimplemented through the embedded type.
type RuntimeService struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	cfg     Config
	pods    *sandbox.Manager
	network NetworkStatus
	stream  *StreamServer // nil: Exec, Attach, PortForward are Unimplemented
	// registries is cfg.Registries until SetRegistries replaces it.
	registries atomic.Pointer[map[string]registry.Host]
	// The node-wide answers of the list calls.
	allPods  kept[*runtimeapi.ListPodSandboxResponse]
	allCtrs  kept[*runtimeapi.ListContainersResponse]
	allStats kept[*runtimeapi.ListContainerStatsResponse]
}

// NetworkStatus reports whether the pod network can take pods, and why not.
type NetworkStatus interface {
	Ready() (bool, string)
}

// NewRuntimeService returns the CRI RuntimeService for a daemon set up as
// cfg, running pods with pods on network.
func NewRuntimeService(cfg Config, pods *sandbox.Manager, network NetworkStatus) *RuntimeService {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &RuntimeService{cfg: cfg, pods: pods, network: network}
	r.registries.Store(&cfg.Registries)
	return r
}

// SetRegistries replaces the registry settings verbose Status shows
// (berthd's SIGHUP reload).
func (r *RuntimeService) SetRegistries(hosts map[string]registry.Host) {
	r.registries.Store(&hosts)
}

// WithStreams makes Exec, Attach and PortForward hand out URLs of s.
func (r *RuntimeService) WithStreams(s *StreamServer) *RuntimeService {
	r.stream = s
	return r
}

// networkCondition is NetworkReady: the kubelet keeps pods that need the pod
// network Pending while it is false.
func (r *RuntimeService) networkCondition() *runtimeapi.RuntimeCondition {
	c := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: true}
	if r.network == nil {
		c.Status, c.Reason, c.Message = false, "NoNetwork", "berthd runs without a pod network"
	} else if ok, why := r.network.Ready(); !ok {
		c.Status, c.Reason, c.Message = false, "NetworkNotReady", why
	}
	return c
}

// Version reports the runtime's name and versions.
func (r *RuntimeService) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{
		Version:           kubeAPIVersion,
		RuntimeName:       runtimeName,
		RuntimeVersion:    RuntimeVersion,
		RuntimeApiVersion: runtimeAPIVersion,
	}, nil
}

// Status reports the runtime ready, whether the pod network is, and the
// features of berth's one runtime handler ("") that the kernel allows.
func (r *RuntimeService) Status(_ context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	resp := &runtimeapi.StatusResponse{
		Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			r.networkCondition(),
		}},
		RuntimeHandlers: []*runtimeapi.RuntimeHandler{r.runtimeHandler()},
		Features:        runtimeFeatures,
	}
	if req.GetVerbose() {
		b, err := json.Marshal(r.verboseConfig())
		if err != nil {
			return nil, err
		}
		resp.Info = map[string]string{"config": string(b)}
	}
	return resp, nil
}

// runtimeFeatures are the CRI features berth honours whatever the handler
// and kernel: supplemental_groups_policy (and ContainerStatus.user) and
// mount_options (noexec, nodev, nosuid on a bind mount: sandbox/spec).
// user_namespaces_host_network stays false: the kernel mounts sysfs only
// for the user namespace that owns the network namespace, and berth refuses
// such a pod (sandbox.podUserNS). TestRuntimeFeaturesDecided holds the
// decision for each feature.
var runtimeFeatures = &runtimeapi.RuntimeFeatures{SupplementalGroupsPolicy: true, MountOptions: true}

// runtimeHandler is the default handler with the features this kernel has
// (none without a pod manager: unit tests).
func (r *RuntimeService) runtimeHandler() *runtimeapi.RuntimeHandler {
	var f sandbox.KernelFeatures
	if r.pods != nil {
		f = r.pods.Features()
	}
	return &runtimeapi.RuntimeHandler{Name: "", Features: &runtimeapi.RuntimeHandlerFeatures{
		RecursiveReadOnlyMounts: f.RecursiveReadOnlyMounts,
		UserNamespaces:          f.UserNamespaces,
	}}
}

// checkHandler refuses a runtime handler berth does not have, as the CRI
// says: berth has one, the default, named "" (and "berth", for clients
// that name the runtime). field names where h came from.
func checkHandler(field, h string) error {
	if h != "" && h != runtimeName {
		return status.Errorf(codes.InvalidArgument, "%s %q: berth has only the default handler", field, h)
	}
	return nil
}

// RuntimeConfig tells the kubelet which cgroup driver to use, so the two agree.
func (r *RuntimeService) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	driver := runtimeapi.CgroupDriver_CGROUPFS
	if r.cfg.CgroupDriver == "systemd" {
		driver = runtimeapi.CgroupDriver_SYSTEMD
	}
	return &runtimeapi.RuntimeConfigResponse{
		Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: driver},
	}, nil
}

type verboseConfig struct {
	Version       string                     `json:"version"`
	Root          string                     `json:"root"`
	ContainerRoot string                     `json:"containerRoot"`
	State         string                     `json:"state"`
	Socket        string                     `json:"socket"`
	CgroupDriver  string                     `json:"cgroupDriver"`
	Network       string                     `json:"network,omitempty"`
	Metrics       string                     `json:"metrics,omitempty"`
	GzipDecoder   string                     `json:"gzipDecoder,omitempty"`
	Registries    map[string]verboseRegistry `json:"registries,omitempty"`
	CDIDevices    []string                   `json:"cdiDevices,omitempty"`
}

// verboseRegistry is registry.Host minus the credentials: verbose Status is
// readable by anyone who can reach the socket and ends up in bug reports.
type verboseRegistry struct {
	Mirrors     []string `json:"mirrors,omitempty"`
	PlainHTTP   bool     `json:"plainHTTP,omitempty"`
	CAFile      string   `json:"caFile,omitempty"`
	SkipVerify  bool     `json:"skipVerify,omitempty"`
	Credentials bool     `json:"credentials,omitempty"`
}

func (r *RuntimeService) verboseConfig() verboseConfig {
	v := verboseConfig{
		Version:       RuntimeVersion,
		Root:          r.cfg.Root,
		ContainerRoot: r.cfg.ContainerRoot,
		State:         r.cfg.State,
		Socket:        r.cfg.Socket,
		CgroupDriver:  r.cfg.CgroupDriver,
		Network:       r.cfg.NetworkMode,
		Metrics:       r.cfg.MetricsAddress,
		GzipDecoder:   r.cfg.GzipDecoder,
	}
	if r.pods != nil {
		v.CDIDevices = r.pods.CDIDevices()
	}
	if regs := *r.registries.Load(); len(regs) > 0 {
		v.Registries = make(map[string]verboseRegistry, len(regs))
		for host, h := range regs {
			v.Registries[host] = verboseRegistry{
				Mirrors:     h.Mirrors,
				PlainHTTP:   h.PlainHTTP,
				CAFile:      strings.Join(caFiles(h), ", "),
				SkipVerify:  h.SkipVerify,
				Credentials: h.Username != "" || h.Password != "",
			}
		}
	}
	return v
}

// caFiles are a host's CA bundles: its ca_file, then a hosts.toml's ca.
func caFiles(h registry.Host) []string {
	if h.CAFile == "" {
		return h.CAFiles
	}
	return append([]string{h.CAFile}, h.CAFiles...)
}

// UpdateRuntimeConfig takes the node's pod CIDR, which the kubelet sends once
// the control plane has given the node one, for the pod network.
func (r *RuntimeService) UpdateRuntimeConfig(_ context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	if err := r.pods.SetPodCIDR(req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr()); err != nil {
		return nil, grpcError(err)
	}
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}
