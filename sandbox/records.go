package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

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
	RawConfig     json.RawMessage   `json:"config"`
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
	// while the container still runs.
	StopSignal string `json:"stopSignal,omitempty"`
	Timeline   []Step `json:"timeline,omitempty"`
}

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

// findPod returns the pod whose ID is id, or the only one whose ID starts
// with it.
func findPod(tx *bolt.Tx, id string) (*Pod, error) {
	v, err := findRecord(tx.Bucket(podsBucket), "pod", id)
	if err != nil {
		return nil, err
	}
	return decodePod(v)
}

func findContainer(tx *bolt.Tx, id string) (*Container, error) {
	v, err := findRecord(tx.Bucket(containersBucket), "container", id)
	if err != nil {
		return nil, err
	}
	return decodeContainer(v)
}

func findRecord(b *bolt.Bucket, kind, id string) ([]byte, error) {
	if id == "" {
		return nil, wrapf(ErrInvalid, "%s ID is required", kind)
	}
	if v := b.Get([]byte(id)); v != nil {
		return v, nil
	}
	var found []byte
	c := b.Cursor()
	for k, v := c.Seek([]byte(id)); k != nil && bytes.HasPrefix(k, []byte(id)); k, v = c.Next() {
		if found != nil {
			return nil, wrapf(ErrInvalid, "%s ID %q is ambiguous", kind, id)
		}
		found = v
	}
	if found == nil {
		return nil, wrapf(ErrNotFound, "%s %q", kind, id)
	}
	return found, nil
}
