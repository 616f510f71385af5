package registry

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clientCert makes a self-signed client certificate and writes it and its
// key as PEM files into dir; it returns the certificate for the server to trust.
func clientCert(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth-node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	for name, b := range map[string][]byte{"client.cert": certPEM, "client.key": keyPEM, "both.pem": append(certPEM, keyPEM...)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHostsDirTLS: a hosts.toml's ca, client and skip_verify reach a real
// TLS registry that requires a client certificate, and its headers go with
// every request; each missing piece fails the connection.
func TestHostsDirTLS(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Node"))
		mu.Unlock()
		w.WriteHeader(http.StatusOK) // GET /v2/: a registry that needs no token
	}))
	certs := t.TempDir()
	pool := x509.NewCertPool()
	pool.AddCert(clientCert(t, certs))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are expected
	srv.StartTLS()
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "https://")
	serverCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	for _, c := range []struct {
		name, hosts string
		ok          bool
	}{
		{"ca and client pair", "ca = \"ca.pem\"\nclient = [[\"" + certs + "/client.cert\", \"" + certs + "/client.key\"]]\n", true},
		{"skip_verify and one pem", "skip_verify = true\nclient = \"" + certs + "/both.pem\"\n", true},
		{"no client certificate", "ca = \"ca.pem\"\n", false},
		{"server not trusted", "client = [\"" + certs + "/client.cert\", \"" + certs + "/client.key\"]\n", false},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "-"), func(t *testing.T) {
			dir := t.TempDir()
			d := writeHosts(t, dir, host, "server = \"https://"+host+"\"\n"+c.hosts+"[header]\n  x-node = \"n1\"\n")
			if err := os.WriteFile(filepath.Join(d, "ca.pem"), serverCA, 0o644); err != nil {
				t.Fatal(err)
			}
			hosts, err := LoadHostsDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			r, err := NewResolver(hosts)
			if err != nil {
				t.Fatal(err)
			}
			eps, err := r.Endpoints(host, nil)
			if err != nil || len(eps) != 1 || eps[0].PlainHTTP {
				t.Fatalf("Endpoints(%s) = %+v, %v; want the registry over TLS", host, eps, err)
			}
			mu.Lock()
			seen = nil
			mu.Unlock()
			resp, err := (&http.Client{Transport: eps[0].Transport}).Get("https://" + host + "/v2/")
			if err == nil {
				resp.Body.Close()
			}
			if c.ok && (err != nil || resp.StatusCode != http.StatusOK) {
				t.Fatalf("GET /v2/ = %v, %v; want 200", resp, err)
			}
			if !c.ok && err == nil {
				t.Fatalf("GET /v2/ succeeded; want the TLS handshake to fail")
			}
			mu.Lock()
			defer mu.Unlock()
			if c.ok && (len(seen) != 1 || seen[0] != "n1") {
				t.Errorf("x-node headers seen %q, want the configured n1", seen)
			}
		})
	}
}
