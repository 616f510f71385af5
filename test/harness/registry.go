package harness

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Service is the service name the test registry's bearer challenges carry.
const Service = "berth-test-registry"

type authMode int

const (
	authNone authMode = iota
	authBasic
	authBearer
)

// Registry is a registry served over plain HTTP on 127.0.0.1 for one test:
// go-containerregistry's in-memory implementation of the distribution protocol,
// wrapped in middleware for auth, per-digest fetch counting and fault injection.
// It is closed by t.Cleanup.
type Registry struct {
	srv   *httptest.Server
	inner http.Handler
	stop  chan struct{}

	auth          authMode
	user, pass    string
	registryToken string // a bearer token the registry accepts (CRI registry_token)
	identityToken string // an OAuth2 refresh token the token endpoint accepts (CRI identity_token)

	mu       sync.Mutex
	faults   map[string]fault    // by digest ("sha256:…")
	fetches  map[string]int      // GETs by digest, after auth
	tokens   map[string]bool     // bearer tokens that grant access
	requests []string            // "GET /v2/… 200", in order
	headers  []http.Header       // of each request, in order
	pushed   int                 // len(requests) after the last Push: what the tests did starts there
	users    []string            // user names of the basic credentials received, in order
	inFlight int                 // blob GETs being served now
	maxIn    int                 // the most blob GETs served at once since ResetFetches
	storage  *BlobStorage        // where blob GETs are redirected, if set
	ranges   map[string][]string // Range headers of blob GETs answered, by digest ("" for a whole blob)
	gates    map[string]gate     // ranged GETs held back, by digest
	stopOnce sync.Once
}

// gate holds back the ranged GETs of a blob that allow refuses until open
// closes.
type gate struct {
	allow func(start, end int64) bool // end exclusive
	open  chan struct{}
}

// RegistryOption configures NewRegistry.
type RegistryOption func(*Registry)

// WithBasicAuth makes every /v2/ request require HTTP basic auth with user/pass;
// others get 401 with a Basic challenge.
func WithBasicAuth(user, pass string) RegistryOption {
	return func(r *Registry) { r.auth, r.user, r.pass = authBasic, user, pass }
}

// WithBearerAuth makes the registry use the token flow: /v2/ answers 401 with
// `WWW-Authenticate: Bearer realm="http://HOST/token",service="berth-test-registry",scope=…`,
// GET /token with basic credentials user/pass (or POST /token with an OAuth2
// password or refresh_token grant) issues a token, and /v2/ then requires
// `Authorization: Bearer <token>`. An anonymous token request gets a token that
// grants nothing, as public registries do for private repositories.
func WithBearerAuth(user, pass string) RegistryOption {
	return func(r *Registry) { r.auth, r.user, r.pass = authBearer, user, pass }
}

// NewRegistry starts a registry on 127.0.0.1:0.
func NewRegistry(t testing.TB, opts ...RegistryOption) *Registry {
	t.Helper()
	r := &Registry{
		inner:         registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		stop:          make(chan struct{}),
		faults:        map[string]fault{},
		fetches:       map[string]int{},
		tokens:        map[string]bool{},
		ranges:        map[string][]string{},
		gates:         map[string]gate{},
		registryToken: "regtoken-" + randomHex(),
		identityToken: "idtoken-" + randomHex(),
	}
	r.tokens[r.registryToken] = true
	for _, o := range opts {
		o(r)
	}
	r.srv = httptest.NewServer(r)
	t.Cleanup(func() {
		r.Stop()
		if t.Failed() {
			r.mu.Lock()
			reqs, pushed := r.requests[r.pushed:], r.pushed
			r.mu.Unlock()
			t.Logf("registry %s requests after the last push (%d earlier ones omitted):\n%s", r.Host(), pushed, strings.Join(reqs, "\n"))
		}
	})
	return r
}

// Stop shuts the registry down before the test ends: it refuses every
// connection from then on (the registry gone away).
func (r *Registry) Stop() {
	r.stopOnce.Do(func() {
		close(r.stop) // releases stalled handlers, so that Close does not wait for them
		r.srv.CloseClientConnections()
		r.srv.Close()
	})
}

// Gate holds back the ranged GETs of blob d whose range allow refuses
// (start, end exclusive) until Ungate or Stop; the others are served.
func (r *Registry) Gate(d v1.Hash, allow func(start, end int64) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gates[d.String()] = gate{allow: allow, open: make(chan struct{})}
}

// Ungate serves the GETs Gate held back, and those to come.
func (r *Registry) Ungate(d v1.Hash) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g, ok := r.gates[d.String()]; ok {
		close(g.open)
		delete(r.gates, d.String())
	}
}

// Ranges lists the Range headers of the GETs of blob d answered so far,
// in order; "" is a request for the whole blob.
func (r *Registry) Ranges(d v1.Hash) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ranges[d.String()]...)
}

// waitGate waits while a gate holds back req, a GET of blob dg; false: the
// registry stopped meanwhile.
func (r *Registry) waitGate(dg string, req *http.Request) bool {
	r.mu.Lock()
	g, gated := r.gates[dg]
	r.mu.Unlock()
	var start, end int64
	if !gated || req.Header.Get("Range") == "" {
		return true
	}
	if _, err := fmt.Sscanf(req.Header.Get("Range"), "bytes=%d-%d", &start, &end); err == nil && g.allow(start, end+1) {
		return true
	}
	select {
	case <-g.open:
		return true
	case <-r.stop:
		return false
	case <-req.Context().Done():
		return false
	}
}

func randomHex() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Host is "127.0.0.1:PORT".
func (r *Registry) Host() string { return strings.TrimPrefix(r.srv.URL, "http://") }

// URL is "http://127.0.0.1:PORT", the form a mirror is configured with.
func (r *Registry) URL() string { return r.srv.URL }

// Username and Password are the credentials the registry accepts.
func (r *Registry) Username() string { return r.user }

// Password is the password the registry accepts.
func (r *Registry) Password() string { return r.pass }

// RegistryToken is a bearer token the registry accepts as is (CRI registry_token).
func (r *Registry) RegistryToken() string { return r.registryToken }

// IdentityToken is an OAuth2 refresh token the token endpoint exchanges for an
// access token (CRI identity_token).
func (r *Registry) IdentityToken() string { return r.identityToken }

// Fetches is how many GET requests for the blob (or manifest by digest) d got
// past auth, counting ranged and aborted ones.
func (r *Registry) Fetches(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fetches[d.String()]
}

// ResetFetches zeroes all fetch counters and MaxInFlight.
func (r *Registry) ResetFetches() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.fetches)
	r.maxIn = r.inFlight
}

// InFlight is how many GETs of blobs (or manifests by digest) are being served now.
func (r *Registry) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inFlight
}

// MaxInFlight is the most GETs of blobs (or manifests by digest) the registry
// was serving at the same time since it started or since ResetFetches.
func (r *Registry) MaxInFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxIn
}

// CredentialUsers lists the user names of the basic credentials the registry
// received (on /v2/ or its token endpoint), one per request, in order.
func (r *Registry) CredentialUsers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.users...)
}

// HeaderValues lists the values of header name over the requests so far.
func (r *Registry) HeaderValues(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, h := range r.headers {
		out = append(out, h.Values(name)...)
	}
	return out
}

// Requests lists the requests served so far as "METHOD PATH STATUS".
func (r *Registry) Requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.requests...)
}

type faultKind int

const (
	faultCorrupt faultKind = iota + 1
	faultTruncate
	faultStall
	faultTrickle
	faultStatus       // answer with an error status instead of the blob
	faultHeldStatus   // hold the GET until Heal, then answer with an error status
	faultRedirectLoop // redirect to the same URL, forever
	faultLength       // declare a Content-Length off by delta
)

type fault struct {
	kind  faultKind
	at    int64 // corrupt: offset of the flipped byte (<0: middle); truncate/stall: offset of the cut
	chunk int   // trickle: bytes per write
	every time.Duration
	code  int   // status, held status: the HTTP status
	delta int64 // length: added to the true Content-Length
	// release is closed by Heal: a trickle under way sends the rest at
	// once, a held GET gets its status.
	release chan struct{}
}

func (r *Registry) setFault(d v1.Hash, f fault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[d.String()] = f
}

// Corrupt makes GETs of blob (or manifest by digest) d serve the same number of
// bytes with the byte at offset inverted; offset < 0 means the middle byte.
func (r *Registry) Corrupt(d v1.Hash, offset int64) {
	r.setFault(d, fault{kind: faultCorrupt, at: offset})
}

// Truncate makes GETs of d send the headers (with the full Content-Length) and
// the blob's bytes up to offset n, then drop the connection. Ranged requests
// that start at or after n get no bytes at all.
func (r *Registry) Truncate(d v1.Hash, n int64) { r.setFault(d, fault{kind: faultTruncate, at: n}) }

// Stall makes GETs of d send the blob's bytes up to offset n and then wait,
// sending nothing more, until the client hangs up (or the registry closes).
func (r *Registry) Stall(d v1.Hash, n int64) { r.setFault(d, fault{kind: faultStall, at: n}) }

// Trickle makes GETs of d slow but steady: chunk bytes, then a pause of every,
// until the blob is sent, or Heal.
func (r *Registry) Trickle(d v1.Hash, chunk int, every time.Duration) {
	if chunk < 1 {
		chunk = 1
	}
	r.setFault(d, fault{kind: faultTrickle, chunk: chunk, every: every, release: make(chan struct{})})
}

// Fail makes GETs of d answer with the HTTP status code (a 5xx, say) and a
// registry error body.
func (r *Registry) Fail(d v1.Hash, code int) { r.setFault(d, fault{kind: faultStatus, code: code}) }

// HoldThenFail makes GETs of d wait, sending nothing, until Heal, and then
// answer with the HTTP status code: the GETs that came before Heal fail
// (a registry refusing those clients, say), those after it are served.
func (r *Registry) HoldThenFail(d v1.Hash, code int) {
	r.setFault(d, fault{kind: faultHeldStatus, code: code, release: make(chan struct{})})
}

// RedirectLoop makes GETs of d redirect (307) to their own URL.
func (r *Registry) RedirectLoop(d v1.Hash) { r.setFault(d, fault{kind: faultRedirectLoop}) }

// BlobStorage is a second HTTP server on 127.0.0.1, on a port of its own,
// that a registry redirects its blob GETs to, as registries send clients to
// their storage: it serves the registry's blobs to anyone and keeps the
// headers of every request it gets.
type BlobStorage struct {
	srv     *httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

// RedirectBlobs makes the registry answer every blob GET, once authorized,
// with a redirect (307) to the same path on a new BlobStorage, closed by
// t.Cleanup.
func (r *Registry) RedirectBlobs(t testing.TB) *BlobStorage {
	t.Helper()
	s := &BlobStorage{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.mu.Lock()
		s.headers = append(s.headers, req.Header.Clone())
		s.mu.Unlock()
		r.inner.ServeHTTP(w, req)
	}))
	t.Cleanup(s.srv.Close)
	r.mu.Lock()
	r.storage = s
	r.mu.Unlock()
	return s
}

// Host is "127.0.0.1:PORT".
func (s *BlobStorage) Host() string { return strings.TrimPrefix(s.srv.URL, "http://") }

// Requests is how many requests the storage has served.
func (s *BlobStorage) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.headers)
}

// HeaderValues lists the values of header name over the requests so far.
func (s *BlobStorage) HeaderValues(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, h := range s.headers {
		out = append(out, h.Values(name)...)
	}
	return out
}

// LieLength makes GETs of d declare a Content-Length delta bytes off the
// blob's size, then send the blob as far as the declared length allows.
func (r *Registry) LieLength(d v1.Hash, delta int64) {
	r.setFault(d, fault{kind: faultLength, delta: delta})
}

// Heal removes the fault on d; the trickles of d under way send the rest
// of their bodies at once.
func (r *Registry) Heal(d v1.Hash) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.faults[d.String()]; ok && f.release != nil {
		close(f.release)
	}
	delete(r.faults, d.String())
}

// ServeHTTP implements http.Handler: auth, counting and faults around the registry.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	defer func() {
		r.mu.Lock()
		r.requests = append(r.requests, fmt.Sprintf("%s %s %d", req.Method, req.URL.Path, rec.status))
		r.headers = append(r.headers, req.Header.Clone())
		r.mu.Unlock()
	}()
	w = rec

	if u, _, ok := req.BasicAuth(); ok {
		r.mu.Lock()
		r.users = append(r.users, u)
		r.mu.Unlock()
	}
	if req.URL.Path == "/token" {
		r.serveToken(w, req)
		return
	}
	if !r.authorized(w, req) {
		return
	}
	dg, ok := digestInPath(req.URL.Path)
	if ok && req.Method == http.MethodGet {
		r.mu.Lock()
		r.fetches[dg]++
		r.inFlight++
		r.maxIn = max(r.maxIn, r.inFlight)
		f, faulty := r.faults[dg]
		storage := r.storage
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			r.inFlight--
			if strings.Contains(req.URL.Path, "/blobs/") && rec.status/100 == 2 {
				r.ranges[dg] = append(r.ranges[dg], req.Header.Get("Range"))
			}
			r.mu.Unlock()
		}()
		if !r.waitGate(dg, req) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		switch {
		case storage != nil && strings.Contains(req.URL.Path, "/blobs/"):
			http.Redirect(w, req, storage.srv.URL+req.URL.Path, http.StatusTemporaryRedirect)
			return
		case faulty && f.kind == faultStatus:
			writeRegistryError(w, f.code, "UNKNOWN", "injected failure")
			return
		case faulty && f.kind == faultHeldStatus:
			select {
			case <-f.release:
				writeRegistryError(w, f.code, "DENIED", "injected failure after a hold")
			case <-r.stop:
				w.WriteHeader(http.StatusServiceUnavailable)
			case <-req.Context().Done():
			}
			return
		case faulty && f.kind == faultRedirectLoop:
			http.Redirect(w, req, req.URL.String(), http.StatusTemporaryRedirect)
			return
		case faulty:
			w = &faultWriter{ResponseWriter: w, f: f, req: req, stop: r.stop}
		}
	}
	r.inner.ServeHTTP(w, req)
}

// digestInPath returns the digest of /v2/NAME/blobs/DIGEST or /v2/NAME/manifests/DIGEST.
func digestInPath(p string) (string, bool) {
	elem := strings.Split(strings.TrimSuffix(p, "/"), "/")
	if len(elem) < 5 || elem[1] != "v2" {
		return "", false
	}
	kind, last := elem[len(elem)-2], elem[len(elem)-1]
	if (kind != "blobs" && kind != "manifests") || !strings.HasPrefix(last, "sha256:") {
		return "", false
	}
	return last, true
}

// repoInPath returns NAME of /v2/NAME/{blobs,manifests,tags}/….
func repoInPath(p string) string {
	elem := strings.Split(strings.TrimPrefix(p, "/v2/"), "/")
	for i := len(elem) - 1; i > 0; i-- {
		switch elem[i] {
		case "blobs", "manifests", "tags":
			return strings.Join(elem[:i], "/")
		}
	}
	return ""
}

func (r *Registry) authorized(w http.ResponseWriter, req *http.Request) bool {
	switch r.auth {
	case authBasic:
		if u, p, ok := req.BasicAuth(); ok && u == r.user && p == r.pass {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="`+Service+`"`)
	case authBearer:
		if tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer "); ok {
			r.mu.Lock()
			valid := r.tokens[tok]
			r.mu.Unlock()
			if valid {
				return true
			}
		}
		challenge := fmt.Sprintf(`Bearer realm="%s/token",service="%s"`, r.URL(), Service)
		if repo := repoInPath(req.URL.Path); repo != "" {
			action := "pull"
			if req.Method != http.MethodGet && req.Method != http.MethodHead {
				action = "pull,push"
			}
			challenge += fmt.Sprintf(`,scope="repository:%s:%s"`, repo, action)
		}
		w.Header().Set("WWW-Authenticate", challenge)
	default:
		return true
	}
	writeRegistryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
	return false
}

func writeRegistryError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"errors": []map[string]string{{"code": code, "message": msg}},
	})
}

// serveToken is the token endpoint of the bearer flow.
func (r *Registry) serveToken(w http.ResponseWriter, req *http.Request) {
	if r.auth != authBearer {
		http.NotFound(w, req)
		return
	}
	var granted, anonymous bool
	refresh := ""
	switch req.Method {
	case http.MethodGet:
		u, p, ok := req.BasicAuth()
		anonymous = !ok
		granted = ok && u == r.user && p == r.pass
	case http.MethodPost:
		if err := req.ParseForm(); err != nil {
			writeRegistryError(w, http.StatusBadRequest, "DENIED", err.Error())
			return
		}
		switch req.PostForm.Get("grant_type") {
		case "refresh_token":
			granted = req.PostForm.Get("refresh_token") == r.identityToken
		case "password":
			granted = req.PostForm.Get("username") == r.user && req.PostForm.Get("password") == r.pass
			if req.PostForm.Get("access_type") == "offline" {
				refresh = r.identityToken
			}
		}
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var tok string
	switch {
	case granted:
		tok = "token-" + randomHex()
		r.mu.Lock()
		r.tokens[tok] = true
		r.mu.Unlock()
	case anonymous:
		tok = "anonymous-" + randomHex() // valid JSON, grants nothing
	default:
		writeRegistryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "incorrect username or password")
		return
	}
	resp := map[string]any{"token": tok, "access_token": tok, "expires_in": 300,
		"issued_at": time.Now().UTC().Format(time.RFC3339)}
	if refresh != "" {
		resp["refresh_token"] = refresh
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// statusRecorder remembers the status code for the request log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// faultWriter applies one fault to the body of a successful GET.
type faultWriter struct {
	http.ResponseWriter
	f      fault
	req    *http.Request
	stop   <-chan struct{}
	status int
	off    int64 // offset in the blob of the next byte written
	size   int64 // size of the whole blob
}

func (w *faultWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *faultWriter) WriteHeader(code int) {
	w.status = code
	h := w.ResponseWriter.Header()
	switch code {
	case http.StatusPartialContent:
		var start, end int64
		_, _ = fmt.Sscanf(h.Get("Content-Range"), "bytes %d-%d/%d", &start, &end, &w.size)
		w.off = start
	default:
		_, _ = fmt.Sscanf(h.Get("Content-Length"), "%d", &w.size)
	}
	if w.f.kind == faultLength && code == http.StatusOK {
		h.Set("Content-Length", fmt.Sprint(w.size+w.f.delta))
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *faultWriter) flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// abort drops the connection; net/http recovers http.ErrAbortHandler silently.
func (w *faultWriter) abort() {
	w.flush()
	panic(http.ErrAbortHandler)
}

func (w *faultWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.status/100 != 2 {
		return w.ResponseWriter.Write(p)
	}
	switch w.f.kind {
	case faultCorrupt:
		at := w.f.at
		if at < 0 {
			at = w.size / 2
		}
		if at >= w.off && at < w.off+int64(len(p)) {
			p = append([]byte(nil), p...)
			p[at-w.off] ^= 0xff
		}
		n, err := w.ResponseWriter.Write(p)
		w.off += int64(n)
		return n, err
	case faultTruncate, faultStall:
		allowed := max(w.f.at-w.off, 0)
		if int64(len(p)) <= allowed {
			n, err := w.ResponseWriter.Write(p)
			w.off += int64(n)
			return n, err
		}
		if _, err := w.ResponseWriter.Write(p[:allowed]); err != nil {
			return 0, err
		}
		w.off += allowed
		w.flush()
		if w.f.kind == faultStall {
			select {
			case <-w.req.Context().Done():
			case <-w.stop:
			}
		}
		w.abort()
	case faultLength:
		// net/http refuses bytes past the declared length; a shorter body
		// than declared ends with the connection closed.
		n, err := w.ResponseWriter.Write(p)
		w.off += int64(n)
		if errors.Is(err, http.ErrContentLength) {
			return len(p), nil
		}
		return n, err
	case faultTrickle:
		written := 0
		for written < len(p) {
			k := min(w.f.chunk, len(p)-written)
			n, err := w.ResponseWriter.Write(p[written : written+k])
			written += n
			w.off += int64(n)
			if err != nil {
				return written, err
			}
			w.flush()
			if written == len(p) {
				break
			}
			select {
			case <-time.After(w.f.every):
			case <-w.f.release:
				w.f = fault{} // healed: this write and the next go at once
				n, err := w.ResponseWriter.Write(p[written:])
				return written + n, err
			case <-w.req.Context().Done():
				return written, w.req.Context().Err()
			case <-w.stop:
				w.abort()
			}
		}
		return written, nil
	}
	return w.ResponseWriter.Write(p)
}

// Pushed describes an image or index pushed to a Registry.
type Pushed struct {
	// Name is the reference it was pushed as, "127.0.0.1:PORT/repo:tag".
	Name string
	// Repo is "127.0.0.1:PORT/repo".
	Repo string
	// Digest is the manifest's (or index's) digest, "sha256:…".
	Digest string
	// ID is the image ID berth must report: the config digest of the image,
	// or of the index's linux/amd64 image.
	ID string
	// Image is the image (the linux/amd64 one for an index).
	Image v1.Image
}

// DigestRef is "127.0.0.1:PORT/repo@sha256:…".
func (p Pushed) DigestRef() string { return p.Repo + "@" + p.Digest }

func (r *Registry) markPushed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pushed = len(r.requests)
}

func (r *Registry) pushAuth() authn.Authenticator {
	if r.auth == authNone {
		return authn.Anonymous
	}
	return &authn.Basic{Username: r.user, Password: r.pass}
}

func (r *Registry) tag(t testing.TB, repoTag string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(r.Host()+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatalf("bad repo:tag %q: %v", repoTag, err)
	}
	return tag
}

// Push pushes img as repoTag ("berth/busybox:1.36"; the tag defaults to latest).
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) Pushed {
	t.Helper()
	tag := r.tag(t, repoTag)
	if err := remote.Write(tag, img, remote.WithAuth(r.pushAuth())); err != nil {
		t.Fatalf("push %s: %v", tag, err)
	}
	r.markPushed()
	return Pushed{Name: tag.String(), Repo: tag.Context().String(), Digest: mustDigest(t, img).String(),
		ID: ConfigDigest(t, img), Image: img}
}

// PushIndex pushes idx (and the images it names) as repoTag. The Pushed's ID and
// Image are those of the index's linux/amd64 entry.
func (r *Registry) PushIndex(t testing.TB, repoTag string, idx v1.ImageIndex) Pushed {
	t.Helper()
	tag := r.tag(t, repoTag)
	if err := remote.WriteIndex(tag, idx, remote.WithAuth(r.pushAuth())); err != nil {
		t.Fatalf("push index %s: %v", tag, err)
	}
	r.markPushed()
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	img := PlatformImage(t, idx, AMD64)
	return Pushed{Name: tag.String(), Repo: tag.Context().String(), Digest: d.String(),
		ID: ConfigDigest(t, img), Image: img}
}

// rawManifest is a manifest pushed byte for byte.
type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// PushRaw uploads blobs as they are, then manifest (of media type mt) as
// repoTag: for manifests go-containerregistry's image types would not build
// (a config whose diff IDs lie, for one). The Pushed has no Image; its ID is
// the config digest the manifest names.
func (r *Registry) PushRaw(t testing.TB, repoTag string, mt types.MediaType, manifest []byte, blobs ...[]byte) Pushed {
	t.Helper()
	tag := r.tag(t, repoTag)
	for _, b := range blobs {
		if err := remote.WriteLayer(tag.Context(), static.NewLayer(b, types.OCIUncompressedLayer), remote.WithAuth(r.pushAuth())); err != nil {
			t.Fatalf("push blob to %s: %v", tag.Context(), err)
		}
	}
	if err := remote.Put(tag, rawManifest{manifest, mt}, remote.WithAuth(r.pushAuth())); err != nil {
		t.Fatalf("push manifest %s: %v", tag, err)
	}
	r.markPushed()
	m, err := v1.ParseManifest(bytes.NewReader(manifest))
	if err != nil {
		t.Fatalf("PushRaw: %v", err)
	}
	return Pushed{Name: tag.String(), Repo: tag.Context().String(), Digest: sha256Digest(manifest), ID: m.Config.Digest.String()}
}

// PushWithConfig pushes img as repoTag with its config changed by edit while
// the manifest keeps img's layers: an image whose config and layers disagree
// (diff IDs that lie, say).
func (r *Registry) PushWithConfig(t testing.TB, repoTag string, img v1.Image, edit func(*v1.ConfigFile)) Pushed {
	t.Helper()
	r.Push(t, repoTag, img) // the layers
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	edit(cf)
	cfg, err := json.Marshal(cf)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m = m.DeepCopy()
	m.Config.Digest, err = v1.NewHash(sha256Digest(cfg))
	if err != nil {
		t.Fatal(err)
	}
	m.Config.Size = int64(len(cfg))
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	mt, err := img.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	return r.PushRaw(t, repoTag, mt, mb, cfg)
}

func sha256Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// FreePort returns a loopback address "127.0.0.1:PORT" on which nothing listens
// (a dead mirror or an unreachable registry host).
func FreePort(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	return addr
}
