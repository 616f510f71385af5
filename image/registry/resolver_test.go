package registry

import (
	"net/http"
	"net/http/httptest"
	"strings"
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
