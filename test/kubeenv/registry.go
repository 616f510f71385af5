package kubeenv

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// busyboxPath is where Debian's busybox-static installs the binary (make deps).
const busyboxPath = "/bin/busybox"

// applets are linked to busybox in the test image's /bin.
var applets = []string{"sh", "httpd", "sleep", "echo", "cat", "touch", "test", "rm", "ls", "mkdir",
	"date", "tar", "wget", "true", "false", "hostname", "id", "ps", "grep", "env", "kill", "seq", "wc", "head", "tail"}

// fixedTime makes the same files give the same layer digest on every run.
var fixedTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// blob is a content-addressed registry object.
type blob struct {
	mediaType string
	data      []byte
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// File is a regular file a tier adds to its test image.
type File struct {
	Name string // its path, relative to the root
	Mode int64
	Data []byte
}

// busyboxImage builds a one-layer OCI image of Debian's busybox-static (with
// applet symlinks, /etc/passwd, /etc/group, /tmp) and files, and returns its
// manifest, config and layer. It is what every test pod runs, with commands
// of its own.
func busyboxImage(t *testing.T, files []File) (manifest, config, layer blob) {
	t.Helper()
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		t.Fatalf("the test image needs Debian's busybox-static (make deps): %v", err)
	}
	entries := []Entry{{Name: "bin", Dir: true, Mode: 0o755}, {Name: "bin/busybox", Mode: 0o755, Data: bb}}
	for _, a := range applets {
		entries = append(entries, Entry{Name: "bin/" + a, Link: "busybox", Mode: 0o777})
	}
	entries = append(entries,
		Entry{Name: "etc", Dir: true, Mode: 0o755},
		Entry{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		Entry{Name: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		Entry{Name: "root", Dir: true, Mode: 0o700},
		Entry{Name: "tmp", Dir: true, Mode: 0o1777})
	for _, f := range files {
		entries = append(entries, Entry{Name: f.Name, Mode: f.Mode, Data: f.Data})
	}
	return oneLayerImage(t, entries, Process{
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cmd: []string{"/bin/sh"},
	})
}

// Registry is a read-only OCI distribution endpoint on loopback: enough of
// the API for a pull (ping, manifests by tag or digest, blobs, GET and HEAD).
type Registry struct {
	Host      string // 127.0.0.1:PORT
	srv       *http.Server
	blobs     map[string]blob   // digest → blob (manifests included)
	manifests map[string]string // "repo:tag" → manifest digest
}

// NewRegistry serves a registry on a loopback port until t ends.
func NewRegistry(t *testing.T) *Registry {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Registry{Host: ln.Addr().String(), blobs: map[string]blob{}, manifests: map[string]string{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

// PushBusybox stores the busybox image with files as repoTag and returns
// its reference and image ID.
func (r *Registry) PushBusybox(t *testing.T, repoTag string, files ...File) (ref, id string) {
	t.Helper()
	manifest, config, layer := busyboxImage(t, files)
	return r.push(repoTag, manifest, config, layer)
}

// push stores an image as repo:tag and returns its reference and image ID
// (the config digest, which berth reports as the image's ID).
func (r *Registry) push(repoTag string, manifest blob, others ...blob) (ref, id string) {
	for _, b := range append(others, manifest) {
		r.blobs[digestOf(b.data)] = b
	}
	r.manifests[repoTag] = digestOf(manifest.data)
	var m struct {
		Config struct{ Digest string }
	}
	_ = json.Unmarshal(manifest.data, &m)
	return r.Host + "/" + repoTag, m.Config.Digest
}

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	p := req.URL.Path
	if p == "/v2/" || p == "/v2" {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		w.WriteHeader(http.StatusOK)
		return
	}
	var b blob
	var ok bool
	var digest string
	switch {
	case strings.HasPrefix(p, "/v2/") && strings.Contains(p, "/manifests/"):
		repo, ref, _ := strings.Cut(strings.TrimPrefix(p, "/v2/"), "/manifests/")
		digest = ref
		if !strings.HasPrefix(ref, "sha256:") {
			digest = r.manifests[repo+":"+ref]
		}
		b, ok = r.blobs[digest]
		ok = ok && strings.Contains(b.mediaType, "manifest")
	case strings.HasPrefix(p, "/v2/") && strings.Contains(p, "/blobs/"):
		_, digest, _ = strings.Cut(p, "/blobs/")
		b, ok = r.blobs[digest]
	}
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"not found"}]}`)
		return
	}
	w.Header().Set("Content-Type", b.mediaType)
	if !strings.Contains(b.mediaType, "manifest") {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.Header().Set("Docker-Content-Digest", digest)
	w.Header().Set("Content-Length", fmt.Sprint(len(b.data)))
	w.WriteHeader(http.StatusOK)
	if req.Method == http.MethodGet {
		w.Write(b.data)
	}
}
