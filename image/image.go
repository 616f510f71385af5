// Package image pulls, imports, stores and removes container images: references,
// registry resolution, the content store, safe layer unpacking into snapshots,
// image metadata and garbage collection of unused layers.
package image

import (
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image/reference"
)

// Image is one stored image, identified by its config digest.
type Image struct {
	// ID is the digest of the image config ("sha256:…").
	ID string `json:"id"`
	// RepoTags are fully qualified names ("docker.io/library/busybox:1.36").
	RepoTags []string `json:"repoTags,omitempty"`
	// RepoDigests are fully qualified digest references of the manifest (or
	// index) as the registry served it ("docker.io/library/busybox@sha256:…").
	RepoDigests []string `json:"repoDigests,omitempty"`
	// Size is the unpacked size of all layers in bytes.
	Size uint64 `json:"size"`
	// Config is the image configuration (Entrypoint, Cmd, Env, User, …).
	Config ocispec.Image `json:"config"`
	// ChainIDs name the image's snapshots, bottom layer first.
	ChainIDs []string `json:"chainIDs"`
	// Manifests are the digests of the manifests and indexes kept for the
	// image in the content store.
	Manifests []string `json:"manifests,omitempty"`
	// Annotations are those of those manifests and indexes, merged (a
	// checkpoint image says so in them, see sandbox/checkpoint.go).
	Annotations map[string]string `json:"annotations,omitempty"`
	// Pinned images are never removed by garbage collection.
	Pinned bool `json:"pinned,omitempty"`
	// Created is when berth first stored the image.
	Created time.Time `json:"created"`
}

// Auth carries registry credentials from a CRI AuthConfig.
type Auth struct {
	Username      string
	Password      string
	Auth          string // base64("user:password")
	IdentityToken string
	RegistryToken string
}

// FsUsage is the space berth uses on one filesystem: the image store's
// (Service.FsInfo), or the writable layers' (the sandbox manager's).
type FsUsage struct {
	Mountpoint string
	UsedBytes  uint64
	Inodes     uint64
	Timestamp  time.Time
}

// ErrNotFound is returned (wrapped) when no stored image matches a reference,
// or a registry has no such image.
var ErrNotFound = errkind.New(errkind.NotFound, "image not found")

// ErrInvalidReference is returned (wrapped) for a malformed image reference.
var ErrInvalidReference = errkind.New(errkind.Invalid, "invalid image reference")

// ErrUnauthorized is returned (wrapped) when a registry refuses the credentials.
var ErrUnauthorized = errkind.New(errkind.Unauthenticated, "unauthorized")

// ErrNoProgress is returned (wrapped) when a pull moved no byte for longer
// than its progress timeout.
var ErrNoProgress = errkind.New(errkind.DeadlineExceeded, "no progress")

// ErrZstdWindow is returned (wrapped) when a zstd layer asks for a larger
// decompression window, the memory its decoder must hold, than berth allows.
// The registry's content is what is wrong, not the request nor berth.
var ErrZstdWindow = errkind.New(errkind.FailedPrecondition, "zstd window too large")

// Names returns how a container made from img should show its image to the
// kubelet: name is the reference the user wrote (asked, or the first repo tag
// when asked is an image ID), and repoDigest the repo digest of the same
// repository ("" when the image came without one, e.g. imported).
func (img *Image) Names(asked string) (name, repoDigest string) {
	name = asked
	if reference.IsID(asked) && len(img.RepoTags) > 0 {
		name = img.RepoTags[0]
	}
	if len(img.RepoDigests) == 0 {
		return name, ""
	}
	if ref, err := reference.Parse(name); err == nil {
		for _, d := range img.RepoDigests {
			if strings.HasPrefix(d, ref.Name()+"@") {
				return name, d
			}
		}
	}
	return name, img.RepoDigests[0]
}
