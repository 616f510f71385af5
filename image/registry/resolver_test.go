package registry

import (
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
	for _, ep := range eps {
		if a, _ := ep.Auth.Authorization(); a.Username != "cri" {
			t.Errorf("%s: CRI credentials must win, got %+v", ep.Host, a)
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
