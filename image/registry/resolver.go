package registry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Endpoint is one place to fetch a repository from: a mirror or the
// registry host itself.
type Endpoint struct {
	Host      string // host[:port] contacted
	PlainHTTP bool
	Mirror    bool
	Transport http.RoundTripper
	Auth      authn.Authenticator
	// CredentialsWithheld is set when credentials exist for this endpoint
	// but it is plain HTTP to another machine, so they are not sent.
	CredentialsWithheld bool
	// PullOnly: only references by digest may be fetched here.
	PullOnly bool
}

// Repository names path inside this endpoint, in go-containerregistry terms.
func (e Endpoint) Repository(path string) (name.Repository, error) {
	opts := []name.Option{name.StrictValidation}
	if e.PlainHTTP {
		opts = append(opts, name.Insecure)
	}
	return name.NewRepository(e.Host+"/"+path, opts...)
}

// Resolver maps a registry domain to its endpoints. Transports are kept per
// host so that connections are reused across pulls.
type Resolver struct {
	hosts map[string]Host

	mu         sync.Mutex
	transports map[string]http.RoundTripper
}

// NewResolver validates the host configuration (mirror URLs, CA files).
func NewResolver(hosts map[string]Host) (*Resolver, error) {
	r := &Resolver{hosts: hosts, transports: map[string]http.RoundTripper{}}
	for host, h := range hosts {
		for _, m := range h.Mirrors {
			if _, _, err := ParseMirror(m); err != nil {
				return nil, fmt.Errorf("registry %q: mirror %q: %w", host, m, err)
			}
		}
		if _, err := r.transport(host); err != nil {
			return nil, fmt.Errorf("registry %q: %w", host, err)
		}
	}
	return r, nil
}

// Endpoints lists where to fetch images of domain from: its mirrors in the
// configured order, then the host itself. creds (from the CRI request) are
// for domain only: a mirror gets its own configured credentials, never them.
func (r *Resolver) Endpoints(domain string, creds *authn.AuthConfig) ([]Endpoint, error) {
	var eps []Endpoint
	for _, m := range r.config(domain).Mirrors {
		host, plain, _ := ParseMirror(m)
		ep, err := r.endpoint(host, plain || r.config(host).PlainHTTP, nil)
		if err != nil {
			return nil, err
		}
		ep.Mirror, ep.PullOnly = true, r.config(host).PullOnly
		eps = append(eps, ep)
	}
	ep, err := r.endpoint(domain, r.config(domain).PlainHTTP, creds)
	if err != nil {
		return nil, err
	}
	return append(eps, ep), nil
}

func (r *Resolver) endpoint(host string, plain bool, creds *authn.AuthConfig) (Endpoint, error) {
	base, err := r.transport(host)
	if err != nil {
		return Endpoint{}, err
	}
	ep := Endpoint{Host: host, PlainHTTP: plain, Auth: authn.Anonymous}
	reg, err := name.NewRegistry(host)
	if err != nil {
		return Endpoint{}, err
	}
	scheme := "https"
	if plain {
		scheme = "http"
	}
	// RegistryStr is where go-containerregistry sends the requests:
	// index.docker.io for "docker.io".
	own := originOf(&url.URL{Scheme: scheme, Host: reg.RegistryStr()})
	ep.Transport = limitRedirects(withHeaders(base, own, r.config(host).Headers))
	cfg, ok := r.credentials(host, creds)
	switch {
	case !ok:
	case plain && !IsLoopback(host):
		ep.CredentialsWithheld = true
	default:
		ep.Auth = authn.FromConfig(cfg)
	}
	return ep, nil
}

// config is host's own settings, else those of DefaultHost ("_default"),
// which stand for every host without its own.
func (r *Resolver) config(host string) Host {
	if h, ok := r.hosts[host]; ok {
		return h
	}
	return r.hosts[DefaultHost]
}

// credentials are the request's creds if any, else host's own from the config.
func (r *Resolver) credentials(host string, creds *authn.AuthConfig) (authn.AuthConfig, bool) {
	if creds != nil && *creds != (authn.AuthConfig{}) {
		return *creds, true
	}
	if c := r.config(host); c.Username != "" {
		return authn.AuthConfig{Username: c.Username, Password: c.Password}, true
	}
	return authn.AuthConfig{}, false
}

// IsLoopback reports whether host[:port] names this machine. Credentials go
// to such a host over plain HTTP too: the bytes never leave the node (and
// go-containerregistry speaks HTTP to loopback registries whatever the
// configuration says).
func IsLoopback(hostport string) bool {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(h, "[]"))
	return ip != nil && ip.IsLoopback()
}

// transport returns the shared transport for host, honouring its CA
// files, skip_verify and client certificates. Each endpoint wraps it with
// the host's headers (withHeaders), so connections are reused across pulls.
func (r *Resolver) transport(host string) (http.RoundTripper, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.transports[host]; ok {
		return t, nil
	}
	h := r.config(host)
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 16
	cas := h.CAFiles
	if h.CAFile != "" {
		cas = append([]string{h.CAFile}, cas...)
	}
	if len(cas) > 0 || h.SkipVerify || len(h.ClientCerts) > 0 {
		cfg := &tls.Config{InsecureSkipVerify: h.SkipVerify} //nolint:gosec // operator's explicit choice
		if len(cas) > 0 {
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			for _, ca := range cas {
				pem, err := os.ReadFile(ca)
				if err != nil {
					return nil, fmt.Errorf("ca_file: %w", err)
				}
				if !pool.AppendCertsFromPEM(pem) {
					return nil, fmt.Errorf("ca_file %s: no PEM certificate found", ca)
				}
			}
			cfg.RootCAs = pool
		}
		for _, pair := range h.ClientCerts {
			cert, err := tls.LoadX509KeyPair(pair[0], pair[1])
			if err != nil {
				return nil, fmt.Errorf("client certificate %s: %w", pair[0], err)
			}
			cfg.Certificates = append(cfg.Certificates, cert)
		}
		t.TLSClientConfig = cfg
	}
	r.transports[host] = t
	return t, nil
}

// origin is the scheme and host:port a request goes to, the port filled in
// from the scheme where the URL has none and the host name in lower case.
type origin struct{ scheme, hostport string }

func originOf(u *url.URL) origin {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return origin{scheme: u.Scheme, hostport: net.JoinHostPort(strings.ToLower(u.Hostname()), port)}
}

// withHeaders sets the configured headers on the requests to the host they
// are configured for, own, and on no other: a redirect to another host or
// port (a registry's blob storage) or from https to http gets none, as the
// headers may be credentials. A loopback host is matched in either scheme:
// go-containerregistry may speak HTTP to it whatever the configuration says,
// and the bytes never leave the node. The headers go on a copy: a
// RoundTripper must not change its caller's request.
func withHeaders(base http.RoundTripper, own origin, headers map[string][]string) http.RoundTripper {
	if len(headers) == 0 {
		return base
	}
	anyScheme := IsLoopback(own.hostport)
	return RoundTripFunc(func(req *http.Request) (*http.Response, error) {
		to := originOf(req.URL)
		if to.hostport != own.hostport || (to.scheme != own.scheme && !anyScheme) {
			return base.RoundTrip(req)
		}
		req = req.Clone(req.Context())
		for k, v := range headers {
			req.Header[http.CanonicalHeaderKey(k)] = v
		}
		return base.RoundTrip(req)
	})
}

// maxRedirects is how many redirects one request may follow, as net/http's
// default policy allows.
const maxRedirects = 10

// limitRedirects bounds redirect chains: go-containerregistry's fetcher
// replaces net/http's redirect policy with one that has no limit, so a
// registry redirecting a blob to itself kept a pull going forever. Each hop
// of a chain reaches the transport carrying the response that caused it.
func limitRedirects(base http.RoundTripper) http.RoundTripper {
	return RoundTripFunc(func(req *http.Request) (*http.Response, error) {
		hops := 0
		for r := req; r.Response != nil && r.Response.Request != nil; r = r.Response.Request {
			if hops++; hops > maxRedirects {
				return nil, fmt.Errorf("GET %s: stopped after %d redirects", req.URL.Redacted(), maxRedirects)
			}
		}
		return base.RoundTrip(req)
	})
}

// RoundTripFunc makes a function an http.RoundTripper.
type RoundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f RoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ParseMirror accepts "http://host:port", "https://host" (optionally with
// the registry API root "/v2", which the client adds anyway) or a bare
// "host[:port]", and reports the host and whether it is plain HTTP.
func ParseMirror(m string) (host string, plainHTTP bool, err error) {
	if !strings.Contains(m, "://") {
		if m == "" || strings.ContainsAny(m, "/?#@ ") {
			return "", false, errors.New("want a URL with scheme http or https, or a bare host[:port]")
		}
		return m, false, nil
	}
	u, err := url.Parse(m)
	if err != nil {
		return "", false, errors.New("not a valid URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", false, errors.New("scheme must be http or https")
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", false, errors.New("must not carry credentials, a query or a fragment")
	case u.Host == "":
		return "", false, errors.New("has no host")
	case strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v2") != "":
		return "", false, fmt.Errorf("path %q: a mirror is a registry root, not a path inside one", u.Path)
	}
	return u.Host, u.Scheme == "http", nil
}

// IsNotFound reports whether a registry answered that the repository or
// manifest does not exist.
func IsNotFound(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	if te.StatusCode == http.StatusNotFound {
		return true
	}
	for _, d := range te.Errors {
		if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
			return true
		}
	}
	return false
}

// IsUnauthorized reports whether a registry refused the credentials.
func IsUnauthorized(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	if te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden {
		return true
	}
	for _, d := range te.Errors {
		if d.Code == transport.UnauthorizedErrorCode || d.Code == transport.DeniedErrorCode {
			return true
		}
	}
	return false
}

// Hosts are the registry settings r was made from (BlobSource).
func (r *Resolver) Hosts() map[string]Host { return r.hosts }
