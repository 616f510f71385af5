package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Blobs fetches the blobs of one repository at one endpoint, whole or by
// byte ranges. Its requests go through the transport go-containerregistry
// builds for the endpoint's credentials (basic, or the bearer token flow)
// on top of the endpoint's own transport (TLS, hosts.toml headers, the
// redirect bound), as the manifest and config requests of the same pull do:
// a ranged request is authorized and routed exactly as a whole one.
type Blobs struct {
	client *http.Client
	repo   name.Repository
}

// RepoTransport is the transport of every request of a pull of repo at e
// (manifests, config, blobs): go-containerregistry's auth (basic, or the
// bearer token flow, whose handshake it makes here, once) over the
// endpoint's own transport with retries; wrap may add to the endpoint's
// transport (the pull's progress count). It is a transport.Wrapper, which
// go-containerregistry's remote uses as it is, without a handshake of its
// own.
func (e Endpoint) RepoTransport(ctx context.Context, repo name.Repository, wrap func(http.RoundTripper) http.RoundTripper) (http.RoundTripper, error) {
	retrying := transport.NewRetry(wrap(e.Transport), transport.WithRetryBackoff(retryBackoff), transport.WithRetryStatusCodes(retryStatuses...))
	return transport.NewWithContext(ctx, repo.Registry, e.Auth, retrying, []string{repo.Scope(transport.PullScope)})
}

// Source names where b fetches from: the endpoint's host (a mirror's,
// where the pull went to one) and the repository.
func (b *Blobs) Source() string { return b.repo.Name() }

// NewBlobs returns the blob fetcher of repo over tr, its RepoTransport.
func NewBlobs(tr http.RoundTripper, repo name.Repository) *Blobs {
	return &Blobs{client: &http.Client{Transport: tr, CheckRedirect: refuseRedirectToPrivate}, repo: repo}
}

// A request that fails before its body (a network error, or a status that
// says "later") is tried again as go-containerregistry tries its own
// (remote's defaults, which it does not export): after 1 s, then 3 s.
// A body cut half way is download.go's to resume.
var (
	retryBackoff  = transport.Backoff{Duration: time.Second, Factor: 3, Jitter: 0.1, Steps: 3}
	retryStatuses = []int{http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, 499, 522}
)

// ErrRangeRefused is a ranged request's answer that cannot be used: 416, or
// a 206 for other bytes than asked. What was downloaded of the blob is then
// suspect, and the download starts over.
var ErrRangeRefused = errors.New("registry refused the byte range")

// BlobBody is the answer to a blob request.
type BlobBody struct {
	io.ReadCloser
	Span   Span // the bytes of the blob that the body carries
	Ranged bool // the registry answered the range (206), so it serves ranges
}

// Get asks for the bytes want of blob digest, a blob of size bytes, with a
// Range header when ranged. The registry may answer a range with the whole
// blob (200): then Span says so.
func (b *Blobs) Get(ctx context.Context, digest string, size int64, want Span, ranged bool) (*BlobBody, error) {
	u := url.URL{Scheme: b.repo.Scheme(), Host: b.repo.RegistryStr(), Path: fmt.Sprintf("/v2/%s/blobs/%s", b.repo.RepositoryStr(), digest)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if ranged {
		req.Header.Set("Range", want.RangeHeader())
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, err
	}
	body, err := checkBlobResponse(resp, size, want, ranged)
	if err != nil {
		resp.Body.Close()
		if te := (*transport.Error)(nil); !errors.As(err, &te) { // which names the request itself
			err = fmt.Errorf("GET %s: %w", u.Redacted(), err)
		}
		return nil, err
	}
	return body, nil
}

func checkBlobResponse(resp *http.Response, size int64, want Span, ranged bool) (*BlobBody, error) {
	if ranged && resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		return nil, fmt.Errorf("%w: %s for %s", ErrRangeRefused, resp.Status, want.RangeHeader())
	}
	if err := transport.CheckError(resp, http.StatusOK, http.StatusPartialContent); err != nil {
		return nil, err
	}
	body := &BlobBody{ReadCloser: resp.Body, Span: Span{0, size}}
	if resp.StatusCode == http.StatusPartialContent {
		got, total, err := ParseContentRange(resp.Header.Get("Content-Range"))
		switch {
		case !ranged:
			return nil, errors.New("206 Partial Content to a request for the whole blob")
		case err != nil:
			return nil, fmt.Errorf("%w: %v", ErrRangeRefused, err)
		case got != want || (total != -1 && total != size):
			return nil, fmt.Errorf("%w: asked %s of %d bytes, got %q", ErrRangeRefused, want.RangeHeader(), size, resp.Header.Get("Content-Range"))
		}
		body.Span, body.Ranged = got, true
	}
	if n := resp.ContentLength; n != -1 && n != body.Span.Len() {
		return nil, fmt.Errorf("Content-Length header %d does not match expected size %d", n, body.Span.Len())
	}
	return body, nil
}

// refuseRedirectToPrivate keeps go-containerregistry's guard for blob
// downloads: a registry may redirect to another host (its storage), but
// not from a public host to a private or link-local address (a cloud's
// metadata service).
func refuseRedirectToPrivate(req *http.Request, via []*http.Request) error {
	from, to := via[0].URL.Hostname(), req.URL.Hostname()
	if from == to {
		return nil
	}
	addr, err := netip.ParseAddr(strings.SplitN(to, "%", 2)[0])
	if err != nil {
		return nil // a name, not an address literal
	}
	addr = addr.Unmap()
	if addr.IsLoopback() || addr.IsPrivate() || addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast() || addr.IsUnspecified() {
		return fmt.Errorf("redirect from %q to private or link-local host %q refused", from, to)
	}
	return nil
}

// BlobSource says where a pull fetched its blobs in terms another process
// can act on: the registry settings of the pull, the domain of its
// reference, the endpoint it used (a mirror or the host) and the
// repository path, with the CRI request's credentials. The lazy layer
// server (image/lazyd) gets it over its socket and fetches with Open the
// chunks a container reads after berthd stopped. It holds credentials:
// it is never written to disk.
type BlobSource struct {
	Hosts    map[string]Host
	Domain   string
	Endpoint string // Endpoint.Host
	Path     string
	Creds    *authn.AuthConfig
}

// Open makes the Blobs of s again: the endpoint's transport and
// credentials as the pull's Resolver gave them, authorized once.
func (s BlobSource) Open(ctx context.Context) (*Blobs, error) {
	r, err := NewResolver(s.Hosts)
	if err != nil {
		return nil, err
	}
	eps, err := r.Endpoints(s.Domain, s.Creds)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(eps, func(e Endpoint) bool { return e.Host == s.Endpoint })
	if i < 0 {
		return nil, fmt.Errorf("registry %s: endpoint %s is not among its endpoints", s.Domain, s.Endpoint)
	}
	repo, err := eps[i].Repository(s.Path)
	if err != nil {
		return nil, err
	}
	tr, err := eps[i].RepoTransport(ctx, repo, func(rt http.RoundTripper) http.RoundTripper { return rt })
	if err != nil {
		return nil, err
	}
	return NewBlobs(tr, repo), nil
}
