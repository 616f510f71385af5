package registry

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
)

func TestEndpointsMirrorsFirst(t *testing.T) {
	r, err := NewResolver(map[string]Host{
		"docker.io":        {Mirrors: []string{"http://127.0.0.1:5000", "mirror.local:443"}},
		"mirror.local:443": {Username: "m", Password: "p"},
	})
	if err != nil {
		t.Fatal(err)
	}
	eps, err := r.Endpoints("docker.io", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		host          string
		plain, mirror bool
	}{{"127.0.0.1:5000", true, true}, {"mirror.local:443", false, true}, {"docker.io", false, false}}
	if len(eps) != len(want) {
		t.Fatalf("got %d endpoints, want %d", len(eps), len(want))
	}
	for i, w := range want {
		if eps[i].Host != w.host || eps[i].PlainHTTP != w.plain || eps[i].Mirror != w.mirror {
			t.Errorf("endpoint %d = %+v, want %+v", i, eps[i], w)
		}
	}
	if a, _ := eps[1].Auth.Authorization(); a.Username != "m" {
		t.Errorf("mirror credentials not used: %+v", a)
	}
	if eps[0].Auth != authn.Anonymous {
		t.Errorf("endpoint without credentials should be anonymous")
	}
	creds := &authn.AuthConfig{Username: "cri", Password: "x"}
	eps, _ = r.Endpoints("docker.io", creds)
	for i, want := range []string{"", "m", "cri"} { // CRI credentials only to the host they are for
		if a, _ := eps[i].Auth.Authorization(); a.Username != want {
			t.Errorf("%s: credentials %+v, want user %q", eps[i].Host, a, want)
		}
	}
	repo, err := eps[0].Repository("library/busybox")
	if err != nil || repo.Scheme() != "http" || repo.RegistryStr() != "127.0.0.1:5000" {
		t.Errorf("repository %v %v", repo, err)
	}
}

func TestNewResolverRejects(t *testing.T) {
	for _, h := range []Host{
		{Mirrors: []string{"ftp://x"}},
		{Mirrors: []string{"http://x/path"}},
		{Mirrors: []string{"https://user:pw@x"}},
		{Mirrors: []string{"x/y"}},
		{Mirrors: []string{""}},
		{CAFile: "/nonexistent/ca.pem"},
	} {
		if _, err := NewResolver(map[string]Host{"docker.io": h}); err == nil {
			t.Errorf("NewResolver(%+v) succeeded; want error", h)
		}
	}
}

func TestCredentialsNeverOverPlainHTTPToAnotherMachine(t *testing.T) {
	r, err := NewResolver(map[string]Host{
		"reg.example":    {PlainHTTP: true, Mirrors: []string{"http://mirror.example", "http://127.0.0.1:5000"}},
		"mirror.example": {Username: "m", Password: "p"},
		"127.0.0.1:5000": {Username: "local", Password: "p"},
		"docker.io":      {Username: "hub", Password: "p", Mirrors: []string{"https://open.example"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	eps, err := r.Endpoints("reg.example", &authn.AuthConfig{Username: "cri", Password: "x"})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		user     string
		withheld bool
	}{{"", true}, {"local", false}, {"", true}} {
		a, _ := eps[i].Auth.Authorization()
		if a.Username != want.user || eps[i].CredentialsWithheld != want.withheld {
			t.Errorf("%s: credentials %+v withheld %v; want user %q withheld %v", eps[i].Host, a, eps[i].CredentialsWithheld, want.user, want.withheld)
		}
	}
	eps, _ = r.Endpoints("docker.io", nil)
	if eps[0].Auth != authn.Anonymous {
		t.Errorf("a mirror got the credentials of the registry it mirrors")
	}
	for _, h := range []string{"localhost:5000", "127.0.0.1", "[::1]:5000", "127.1.2.3:80"} {
		if !IsLoopback(h) {
			t.Errorf("IsLoopback(%q) = false", h)
		}
	}
	for _, h := range []string{"10.0.0.1:5000", "localhost.example", "[2001:db8::1]:5000"} {
		if IsLoopback(h) {
			t.Errorf("IsLoopback(%q) = true", h)
		}
	}
}

func TestRedirectLoopStops(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		http.Redirect(w, r, r.URL.String(), http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	// As go-containerregistry's fetcher: a redirect policy without a limit.
	c := &http.Client{Transport: limitRedirects(http.DefaultTransport), CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
	_, err := c.Get(srv.URL + "/v2/x/blobs/sha256:00")
	if err == nil || !strings.Contains(err.Error(), "stopped after 10 redirects") {
		t.Errorf("Get = %v, want stopped after 10 redirects", err)
	}
	if hits != maxRedirects+1 {
		t.Errorf("the registry saw %d requests, want %d", hits, maxRedirects+1)
	}
}

// recordHeaders stands in for a host's shared transport: it answers 200 and
// keeps the value of header name on each request, by URL.
func recordHeaders(name string, seen map[string]string) RoundTripFunc {
	return func(req *http.Request) (*http.Response, error) {
		seen[req.URL.String()] = req.Header.Get(name)
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
	}
}

// TestHeadersOnlyToTheirHost: a host's configured headers go to its own
// scheme, host and port only (#21): not to another host or port, and not
// over http to a host configured for https; a loopback host in either scheme.
func TestHeadersOnlyToTheirHost(t *testing.T) {
	secret := map[string][]string{"authorization": {"Bearer s3cret"}}
	r, err := NewResolver(map[string]Host{
		"reg.example":    {Headers: secret},
		"plain.example":  {PlainHTTP: true, Headers: secret},
		"docker.io":      {Headers: secret},
		"127.0.0.1:5000": {Headers: secret},
	})
	if err != nil {
		t.Fatal(err)
	}
	for host, urls := range map[string]map[string]bool{ // URL: whether it gets the headers
		"reg.example": {
			"https://reg.example/v2/":                        true,
			"https://REG.example:443/v2/x/blobs/sha256:00":   true,
			"http://reg.example/v2/x/blobs/sha256:00":        false,
			"http://reg.example:443/v2/x/blobs/sha256:00":    false,
			"https://reg.example:8443/v2/x/blobs/sha256:00":  false,
			"https://storage.example/v2/x/blobs/sha256:00":   false,
			"https://reg.example.storage.example/v2/":        false,
			"https://storage.example/reg.example/v2/x/blobs": false,
		},
		"plain.example": {
			"http://plain.example/v2/":     true,
			"http://plain.example:80/v2/":  true,
			"https://plain.example/v2/":    false,
			"http://plain.example:81/v2/":  false,
			"http://storage.example/v2/":   false,
			"http://127.0.0.1:80/v2/":      false,
			"https://plain.example:80/v2/": false,
		},
		"docker.io": {
			"https://index.docker.io/v2/":              true,
			"https://production.cloudflare.docker.com": false,
		},
		"127.0.0.1:5000": {
			"http://127.0.0.1:5000/v2/":  true,
			"https://127.0.0.1:5000/v2/": true,
			"http://127.0.0.1:5001/v2/":  false,
			"http://localhost:5000/v2/":  false,
		},
	} {
		seen := map[string]string{}
		r.transports[host] = recordHeaders("Authorization", seen)
		eps, err := r.Endpoints(host, nil)
		if err != nil {
			t.Fatal(err)
		}
		for u, want := range urls {
			req, err := http.NewRequest(http.MethodGet, u, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := eps[0].Transport.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := seen[u] != ""; got != want {
				t.Errorf("%s configured: GET %s carried Authorization %q; want it: %v", host, u, seen[u], want)
			}
			if req.Header.Get("Authorization") != "" {
				t.Errorf("GET %s: the caller's request was changed", u)
			}
		}
	}
}

// TestHeadersNotFollowingRedirects: a registry that redirects a blob GET to
// another server (on another port of the same address) gets its configured
// headers; the redirect target does not, and the GET succeeds.
func TestHeadersNotFollowingRedirects(t *testing.T) {
	var mu sync.Mutex
	var atStorage []http.Header
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		atStorage = append(atStorage, req.Header.Clone())
		mu.Unlock()
		_, _ = io.WriteString(w, "blob")
	}))
	defer storage.Close()
	var atRegistry []string
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		atRegistry = append(atRegistry, req.Header.Get("Authorization")+"|"+req.Header.Get("X-Node"))
		mu.Unlock()
		http.Redirect(w, req, storage.URL+req.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	r, err := NewResolver(map[string]Host{host: {PlainHTTP: true, Headers: map[string][]string{
		"Authorization": {"Bearer s3cret"}, "x-node": {"n1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	eps, err := r.Endpoints(host, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: eps[0].Transport}).Get(reg.URL + "/v2/x/blobs/sha256:00")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "blob" {
		t.Errorf("GET through the redirect = %q, want the blob", body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(atRegistry) != 1 || atRegistry[0] != "Bearer s3cret|n1" {
		t.Errorf("the registry saw Authorization|X-Node %q, want the configured headers", atRegistry)
	}
	if len(atStorage) != 1 {
		t.Fatalf("the redirect target saw %d requests, want 1", len(atStorage))
	}
	if h := atStorage[0]; h.Get("Authorization") != "" || h.Get("X-Node") != "" {
		t.Errorf("the redirect target got the registry's headers: %v", h)
	}
}
