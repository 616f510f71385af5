package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image/reference"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Annotations that name an image inside an OCI layout.
const (
	containerdNameAnnotation = "io.containerd.image.name"
	ociRefNameAnnotation     = "org.opencontainers.image.ref.name"
)

// Import stores the images of an OCI layout folder or a `docker save`
// tarball found at path, for this node's platform.
func (s *Service) Import(ctx context.Context, path string) ([]*Image, error) {
	info, err := os.Stat(path)
	if err != nil {
		// A path that names nothing is the caller's fault; a filesystem
		// that refuses root or fails is the node's.
		return nil, errkind.PathErrorf(err, "import: %w", err)
	}
	var out []*Image
	add := func(img v1.Image, n names, keep [][]byte) error {
		stored, err := s.store(ctx, img, n, keep, localLayers, nil)
		if err != nil {
			return fmt.Errorf("import %s: %w", path, err)
		}
		out = append(out, stored)
		return nil
	}
	if info.IsDir() {
		err = s.importLayout(path, add)
	} else {
		err = importTarball(path, add)
	}
	if errors.Is(err, fs.ErrNotExist) {
		// Part of what the caller pointed at is missing.
		err = fmt.Errorf("%w: import %s: %w", ErrInvalidReference, path, err)
	}
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("%w: import %s: no image for %s/%s", ErrNotFound, path, s.platform.OS, s.platform.Architecture)
	}
	return out, err
}

type importFunc func(img v1.Image, n names, keep [][]byte) error

// importLayout stores every image an OCI layout names at its top level; a
// nested index contributes the manifest for this node's platform.
func (s *Service) importLayout(path string, add importFunc) error {
	idx, err := layout.ImageIndexFromPath(path)
	if err != nil {
		return fmt.Errorf("%w: import %s: not an OCI layout: %v", ErrInvalidReference, path, err)
	}
	top, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, desc := range top.Manifests {
		n := layoutNames(desc)
		img, keep, err := s.resolveLayoutImage(idx, desc)
		if err != nil {
			return fmt.Errorf("import %s: %s: %w", path, desc.Digest, err)
		}
		if img == nil {
			continue // no manifest for this platform
		}
		if err := add(img, n, keep); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) resolveLayoutImage(idx v1.ImageIndex, desc v1.Descriptor) (v1.Image, [][]byte, error) {
	if !desc.MediaType.IsIndex() {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, nil, err
		}
		raw, err := img.RawManifest()
		return img, [][]byte{raw}, err
	}
	child, err := idx.ImageIndex(desc.Digest)
	if err != nil {
		return nil, nil, err
	}
	found, err := partial.FindManifests(child, match.Platforms(s.platform))
	if err != nil || len(found) == 0 {
		return nil, nil, err
	}
	childRaw, err := child.RawManifest()
	if err != nil {
		return nil, nil, err
	}
	img, err := child.Image(found[0].Digest)
	if err != nil {
		return nil, nil, err
	}
	raw, err := img.RawManifest()
	return img, [][]byte{childRaw, raw}, err
}

// layoutNames reads an image's name from its descriptor's annotations. An
// annotation holding only a tag ("latest") names nothing berth can store.
func layoutNames(desc v1.Descriptor) names {
	for _, key := range []string{containerdNameAnnotation, ociRefNameAnnotation} {
		r, err := reference.Parse(desc.Annotations[key])
		if err != nil {
			continue
		}
		n := names{digests: []string{r.Name() + "@" + desc.Digest.String()}}
		if r.Tag != "" {
			n.tags = []string{r.TagString()}
		}
		return n
	}
	return names{}
}

// importTarball stores the images of a `docker save` tarball under their
// RepoTags.
func importTarball(path string, add importFunc) error {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return fmt.Errorf("%w: import %s: not a docker-save tarball or OCI layout: %v", ErrInvalidReference, path, err)
	}
	for i, desc := range manifest {
		var n names
		var tag *name.Tag
		for _, t := range desc.RepoTags {
			r, err := reference.Parse(t)
			if err != nil {
				return fmt.Errorf("%w: import %s: tag %q: %v", ErrInvalidReference, path, t, err)
			}
			n.tags = append(n.tags, r.TagString())
			if tag == nil {
				parsed, err := name.NewTag(t)
				if err != nil {
					return fmt.Errorf("%w: import %s: tag %q: %v", ErrInvalidReference, path, t, err)
				}
				tag = &parsed
			}
		}
		if tag == nil && len(manifest) > 1 {
			return fmt.Errorf("%w: import %s: image %d has no tag and is not alone in the tarball", ErrInvalidReference, path, i)
		}
		img, err := tarball.Image(opener, tag)
		if err != nil {
			return fmt.Errorf("import %s: %w", path, err)
		}
		if err := add(img, n, nil); err != nil {
			return err
		}
	}
	return nil
}
