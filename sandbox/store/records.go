package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-runtime/berth/sandbox/spec"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var (
	podsBucket       = []byte("pods")
	containersBucket = []byte("containers")
)

// Step is one timed stage of a pod or container start, shown in verbose
// status so an operator sees where the time went.
type Step struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
}

// Pod is the durable record of a pod sandbox.
type Pod struct {
	ID        string                       `json:"id"`
	Config    *runtimeapi.PodSandboxConfig `json:"-"`
	State     runtimeapi.PodSandboxState   `json:"state"`
	CreatedAt time.Time                    `json:"createdAt"`
	Cgroup    string                       `json:"cgroup"`
	IP        string                       `json:"ip,omitempty"` // from the pod network; kept after stop for status
	// AdditionalIPs are the pod's other addresses (CNI), after IP.
	AdditionalIPs []string          `json:"additionalIPs,omitempty"`
	Pins          map[string]string `json:"pins,omitempty"` // namespace kind → pin file
	PausePID      int               `json:"pausePID,omitempty"`
	Files         map[string]string `json:"files,omitempty"` // hosts, resolv, hostname, shm
	Timeline      []Step            `json:"timeline,omitempty"`
	// CleanupFailed says which step of a failed RunPod's rollback failed,
	// and why: the pod is kept NOTREADY, holding what is left, for
	// StopPodSandbox and RemovePodSandbox to finish (see
	// sandbox.Manager.keepFailedPod).
	CleanupFailed string          `json:"cleanupFailed,omitempty"`
	RawConfig     json.RawMessage `json:"config"`
}

// Container is the durable record of a container; its live state comes
// from the pod's shim or, when the shim is gone, from its exit file.
type Container struct {
	ID        string                      `json:"id"`
	PodID     string                      `json:"podID"`
	Config    *runtimeapi.ContainerConfig `json:"-"`
	RawConfig json.RawMessage             `json:"config"`
	ImageID   string                      `json:"imageID"`
	ImageRef  string                      `json:"imageRef"` // what the kubelet asked for
	// ImageName and RepoDigest are what status shows as the image and its
	// ref: the name the user wrote and the registry's digest for it.
	ImageName  string    `json:"imageName,omitempty"`
	RepoDigest string    `json:"repoDigest,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	LogPath    string    `json:"logPath"`
	// StopSignal is the image's, kept here: the image may be removed
	// while the container still runs. Config.stop_signal, when set, wins
	// (see SignalInForce).
	StopSignal string `json:"stopSignal,omitempty"`
	Timeline   []Step `json:"timeline,omitempty"`
	// User is the identity of the container's process, from its spec;
	// nil in records from before berth kept it.
	User *specs.User `json:"user,omitempty"`
	// Resources are the cgroup limits in force, as cgroups.SpecResources
	// made them: at create, then from each UpdateContainerResources. Kept
	// here so that status is served from the view, not from the spec on
	// disk; nil in records from before berth kept them.
	Resources *specs.LinuxResources `json:"resources,omitempty"`
	// LayerRoot is the container root its writable layer was made under
	// (see sandbox.Manager.layerDir); empty in records from before berth
	// kept it, whose layers are under the persistent root.
	LayerRoot string `json:"layerRoot,omitempty"`
	// Restored: the container is restored from its image, a checkpoint,
	// whose layer (the archive) it leases until it is removed.
	Restored bool `json:"restored,omitempty"`
	// CleanupFailed says which step of a failed CreateContainer's rollback
	// failed, and why: the container is kept, reported exited, holding
	// what is left, for RemoveContainer to finish (see
	// sandbox.Manager.keepFailedContainer).
	CleanupFailed string `json:"cleanupFailed,omitempty"`
}

// SignalInForce is the signal StopContainer sends first, and its CRI name:
// the container's stop_signal, else the image's STOPSIGNAL, else SIGTERM.
// Both were checked at create; a record from before that check falls back
// to SIGTERM.
func (c *Container) SignalInForce() (syscall.Signal, runtimeapi.Signal) {
	if s := c.Config.GetStopSignal(); s != runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT {
		if sig, err := CRISignal(s); err == nil {
			return sig, s
		}
	}
	sig, err := spec.StopSignal(c.StopSignal)
	if err != nil {
		sig = syscall.SIGTERM
	}
	return sig, criSignalNames()[sig]
}

// CRISignal is the signal a CRI Signal names ("SIGNAL_SIGRTMINPLUS1" is
// RTMIN+1), parsed as an image's StopSignal is, so that both agree.
func CRISignal(s runtimeapi.Signal) (syscall.Signal, error) {
	name, ok := runtimeapi.Signal_name[int32(s)]
	if !ok || s == runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT {
		return 0, fmt.Errorf("unknown signal %d", s)
	}
	name = strings.TrimPrefix(name, "SIGNAL_")
	name = strings.Replace(name, "MINPLUS", "MIN+", 1)
	name = strings.Replace(name, "MAXMINUS", "MAX-", 1)
	return spec.StopSignal(name)
}

// criSignalNames maps each signal to its CRI name; where the CRI has two
// names for one signal (SIGABRT and SIGIOT) the first in the enum wins.
// A signal the CRI has no name for (32, 33) is RUNTIME_DEFAULT.
var criSignalNames = sync.OnceValue(func() map[syscall.Signal]runtimeapi.Signal {
	names := map[syscall.Signal]runtimeapi.Signal{}
	for v := range runtimeapi.Signal_name {
		s := runtimeapi.Signal(v)
		sig, err := CRISignal(s)
		if err != nil {
			continue
		}
		if old, ok := names[sig]; !ok || s < old {
			names[sig] = s
		}
	}
	return names
})

func marshalRecord(v any, cfg proto.Message, raw *json.RawMessage) ([]byte, error) {
	b, err := protojson.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	*raw = b
	return json.Marshal(v)
}

func putPod(tx *bolt.Tx, p *Pod) error {
	v, err := marshalRecord(p, p.Config, &p.RawConfig)
	if err != nil {
		return err
	}
	return tx.Bucket(podsBucket).Put([]byte(p.ID), v)
}

func putContainer(tx *bolt.Tx, c *Container) error {
	v, err := marshalRecord(c, c.Config, &c.RawConfig)
	if err != nil {
		return err
	}
	return tx.Bucket(containersBucket).Put([]byte(c.ID), v)
}

func decodePod(v []byte) (*Pod, error) {
	var p Pod
	if err := json.Unmarshal(v, &p); err != nil {
		return nil, err
	}
	p.Config = &runtimeapi.PodSandboxConfig{}
	if err := protojson.Unmarshal(p.RawConfig, p.Config); err != nil {
		return nil, fmt.Errorf("pod %s: %w", p.ID, err)
	}
	return &p, nil
}

func decodeContainer(v []byte) (*Container, error) {
	var c Container
	if err := json.Unmarshal(v, &c); err != nil {
		return nil, err
	}
	c.Config = &runtimeapi.ContainerConfig{}
	if err := protojson.Unmarshal(c.RawConfig, c.Config); err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	return &c, nil
}
