package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/berth-runtime/berth/image/reference"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// OpenTelemetry's global tracer: a no-op unless berthd set up tracing.
var tracer = otel.Tracer("github.com/berth-runtime/berth/image")

// Pull fetches ref from its registry (mirrors first) and stores it. auth may
// be nil. Concurrent pulls of one reference with the same credentials share
// one transfer, which runs on a context of its own: a caller that gives up
// leaves the others waiting, and the transfer stops when the last one left.
func (s *Service) Pull(ctx context.Context, ref string, auth *Auth) (*Image, error) {
	r, err := reference.Parse(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidReference, err)
	}
	f := s.joinPull(ctx, r, auth)
	select {
	case <-f.done:
		return f.img, f.err
	case <-ctx.Done():
		s.leavePull(f)
		return nil, fmt.Errorf("pull %s: %w", r, context.Cause(ctx))
	}
}

// pullFlight is one shared transfer; img and err are set before done closes.
type pullFlight struct {
	key     string
	done    chan struct{}
	img     *Image
	err     error
	waiters int // callers still waiting, under pullsMu
	cancel  context.CancelFunc
}

// joinPull returns the transfer of r with auth, starting it if none runs.
// The transfer keeps the first caller's context values (logging, tracing)
// but not its cancellation.
func (s *Service) joinPull(ctx context.Context, r reference.Ref, auth *Auth) *pullFlight {
	key := r.String() + "\x00" + auth.fingerprint()
	s.pullsMu.Lock()
	defer s.pullsMu.Unlock()
	if f, ok := s.pulls[key]; ok {
		f.waiters++
		return f
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &pullFlight{key: key, done: make(chan struct{}), waiters: 1, cancel: cancel}
	s.pulls[key] = f
	go func() {
		f.img, f.err = s.pull(pctx, r, auth)
		cancel()
		s.pullsMu.Lock()
		if s.pulls[key] == f {
			delete(s.pulls, key)
		}
		s.pullsMu.Unlock()
		close(f.done)
	}()
	return f
}

// leavePull drops a caller that gave up; the last one cancels the transfer,
// and a later caller starts a new one.
func (s *Service) leavePull(f *pullFlight) {
	s.pullsMu.Lock()
	defer s.pullsMu.Unlock()
	if f.waiters--; f.waiters > 0 {
		return
	}
	f.cancel()
	if s.pulls[f.key] == f {
		delete(s.pulls, f.key)
	}
}

func (a *Auth) fingerprint() string {
	if a == nil {
		return ""
	}
	h := sha256.Sum256([]byte(a.Username + "\x00" + a.Password + "\x00" + a.Auth + "\x00" + a.IdentityToken + "\x00" + a.RegistryToken))
	return hex.EncodeToString(h[:])
}

func (a *Auth) config() *authn.AuthConfig {
	if a == nil {
		return nil
	}
	return &authn.AuthConfig{Username: a.Username, Password: a.Password, Auth: a.Auth,
		IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
}

func (s *Service) pull(ctx context.Context, r reference.Ref, auth *Auth) (_ *Image, err error) {
	start := time.Now()
	ctx, span := tracer.Start(ctx, "pull", trace.WithAttributes(attribute.String("image.ref", r.String())))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watch := watchProgress(ctx, cancel, s.opts.ProgressTimeout, r.String(), s.log)
	defer watch.Close()
	defer func() { s.metrics.pulled(start, watch.bytes.Load(), err) }()

	resolver := s.resolver.Load() // one pull, one set of registry settings
	endpoints, err := resolver.Endpoints(r.Domain, auth.config())
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, ep := range endpoints {
		if ep.PullOnly && r.Digest == "" {
			continue // may not resolve tags (hosts.toml capabilities)
		}
		repo, tr, desc, img, err := s.fetchManifest(ctx, ep, r, watch)
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				return nil, cause
			}
			s.log.Debug("pull: endpoint failed", "ref", r.String(), "endpoint", ep.Host, "err", err)
			if ep.CredentialsWithheld {
				err = fmt.Errorf("credentials are never sent over plain HTTP to another machine: %w", err)
			}
			errs = append(errs, fmt.Errorf("%s: %w", ep.Host, err))
			continue
		}
		// Names are the reference the user asked for, never the mirror's.
		n := names{digests: []string{r.DigestString(digest.Digest(desc.Digest.String()))}}
		if r.Digest == "" {
			n.tags = []string{r.TagString()}
		}
		manifest, err := img.RawManifest()
		if err != nil {
			return nil, err
		}
		stored, err := s.store(ctx, img, n, [][]byte{desc.Manifest, manifest}, s.remoteLayers(registry.NewBlobs(tr, repo), &registry.BlobSource{
			Hosts: resolver.Hosts(), Domain: r.Domain, Endpoint: ep.Host, Path: r.Path, Creds: auth.config()}, watch), watch)
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				return nil, cause
			}
			return nil, fmt.Errorf("pull %s from %s: %w", r, ep.Host, err)
		}
		s.log.Info("pulled image", "ref", r.String(), "id", stored.ID, "endpoint", ep.Host, "duration", time.Since(start))
		return stored, nil
	}
	return nil, pullError(r, errs)
}

// fetchManifest resolves r at one endpoint to the image for this node's
// platform, and the descriptor of what the reference names (maybe an
// index). It returns the repository's transport too, authorized once for
// the manifests, the config and the layers: a registry that fails that
// handshake fails here, and the pull tries the next endpoint.
func (s *Service) fetchManifest(ctx context.Context, ep registry.Endpoint, r reference.Ref, watch *progressWatch) (name.Repository, http.RoundTripper, *remote.Descriptor, v1.Image, error) {
	repo, err := ep.Repository(r.Path)
	if err != nil {
		return repo, nil, nil, nil, err
	}
	tr, err := ep.RepoTransport(ctx, repo, watch.transport)
	if err != nil {
		return repo, nil, nil, nil, err
	}
	var ref name.Reference = repo.Tag(r.Tag)
	if r.Digest != "" {
		ref = repo.Digest(r.Digest.String())
	}
	desc, err := remote.Get(ref,
		remote.WithContext(ctx),
		remote.WithTransport(tr),
		remote.WithPlatform(s.platform))
	if err != nil {
		return repo, nil, nil, nil, err
	}
	img, err := desc.Image()
	if err != nil {
		return repo, nil, nil, nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return repo, tr, desc, img, nil
}

// pullError sums up why no endpoint served the image: unauthorized wins over
// not found, which wins over anything else.
func pullError(r reference.Ref, errs []error) error {
	all := errors.Join(errs...)
	for _, err := range errs {
		if registry.IsUnauthorized(err) {
			return fmt.Errorf("%w: pull %s: %v", ErrUnauthorized, r, all)
		}
	}
	for _, err := range errs {
		if registry.IsNotFound(err) {
			return fmt.Errorf("%w: %s: %v", ErrNotFound, r, all)
		}
	}
	return fmt.Errorf("pull %s: %w", r, all)
}
