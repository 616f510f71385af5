package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
)

// pki is the run's own certificate authority: every component's serving
// and client certificate is signed by it, and every component trusts only it.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
}

// certPair names a certificate and its key on disk.
type certPair struct{ cert, key string }

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	kubeenv.Mkdirs(t, dir)
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "berth-cluster-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: dir, caCert: cert, caKey: key, caFile: filepath.Join(dir, "ca.crt")}
	writePEM(t, p.caFile, "CERTIFICATE", der)
	writeKey(t, filepath.Join(dir, "ca.key"), key)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t *testing.T, path string, key *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "EC PRIVATE KEY", der)
}

// issue signs a certificate for name: a client certificate for user cn in
// groups orgs, and a serving one too when it has hosts (IPs or DNS names).
func (p *pki) issue(t *testing.T, name, cn string, orgs []string, hosts ...string) certPair {
	t.Helper()
	key := newKey(t)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	cp := certPair{cert: filepath.Join(p.dir, name+".crt"), key: filepath.Join(p.dir, name+".key")}
	writePEM(t, cp.cert, "CERTIFICATE", der)
	writeKey(t, cp.key, key)
	return cp
}

// serviceAccountKey writes the key pair the API server signs service account
// tokens with (and the controller-manager, for the tokens it makes).
func (p *pki) serviceAccountKey(t *testing.T) (pub, priv string) {
	t.Helper()
	key := newKey(t)
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv = filepath.Join(p.dir, "sa.pub"), filepath.Join(p.dir, "sa.key")
	writePEM(t, pub, "PUBLIC KEY", pubDER)
	writeKey(t, priv, key)
	return pub, priv
}

// kubeconfig writes a kubeconfig for the API server at server with pair as
// the client certificate.
func (p *pki) kubeconfig(t *testing.T, name, server string, pair certPair) string {
	t.Helper()
	path := filepath.Join(p.dir, name+".kubeconfig")
	body := "apiVersion: v1\nkind: Config\n" +
		"clusters:\n- name: berth\n  cluster:\n    server: " + server + "\n    certificate-authority: " + p.caFile + "\n" +
		"users:\n- name: " + name + "\n  user:\n    client-certificate: " + pair.cert + "\n    client-key: " + pair.key + "\n" +
		"contexts:\n- name: berth\n  context:\n    cluster: berth\n    user: " + name + "\n" +
		"current-context: berth\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
