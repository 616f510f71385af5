package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// writeHostsTOML writes DIR/HOST/hosts.toml.
func writeHostsTOML(t *testing.T, dir, host, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestContainerdHostsDir: a containerd certs.d tree is honoured: a host's
// mirror (with its headers) and _default's mirror for every other host
// serve pulls of registries nobody answers for; a mirror without the
// resolve capability serves references by digest only; berth's own table
// for a host wins over the folder's.
func TestContainerdHostsDir(t *testing.T) {
	harness.RequireIntegration(t)
	live := harness.NewRegistry(t)
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	p := live.Push(t, "berth/busybox:certsd", img)
	pullOnly := harness.NewRegistry(t)
	pullOnly.Push(t, "berth/busybox:certsd", img)
	pushed := len(pullOnly.Requests())
	unreachable := harness.FreePort(t) // a registry host nobody answers on
	other := harness.FreePort(t)
	own := harness.FreePort(t)
	digestOnly := harness.FreePort(t)

	dir := t.TempDir()
	writeHostsTOML(t, dir, unreachable, `server = "http://`+unreachable+`"

[host."`+live.URL()+`"]
  capabilities = ["pull", "resolve"]
  [host."`+live.URL()+`".header]
    x-berth-certsd = "mirror"
`)
	writeHostsTOML(t, dir, "_default", `[host."`+live.URL()+`"]
  capabilities = ["pull", "resolve"]
  [host."`+live.URL()+`".header]
    x-berth-certsd = "mirror"
`)
	writeHostsTOML(t, dir, digestOnly, `[host."`+pullOnly.URL()+`"]
  capabilities = ["pull"]
`)
	// own's table in berth's config names no mirror: _default must not apply.
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: "[registry]\nconfig_path = \"" + dir + "\"\n" +
		harness.RegistryTOML(map[string]harness.HostConfig{own: {PlainHTTP: true}})})

	for _, ref := range []string{unreachable + "/berth/busybox:certsd", other + "/berth/busybox:certsd"} {
		if id, err := pull(t, d, ref, nil); err != nil || id != p.ID {
			t.Fatalf("PullImage(%s) through the hosts folder = %q, %v; want %s", ref, id, err, p.ID)
		}
		st := mustStatus(t, d, ref)
		if !slices.Contains(st.RepoTags, ref) || !slices.Contains(st.RepoDigests, strings.TrimSuffix(ref, ":certsd")+"@"+p.Digest) {
			t.Errorf("%s recorded as %v %v", ref, st.RepoTags, st.RepoDigests)
		}
		assertNoMention(t, st, live.Host())
	}
	if h := live.HeaderValues("X-Berth-Certsd"); len(h) == 0 || slices.ContainsFunc(h, func(v string) bool { return v != "mirror" }) {
		t.Errorf("the mirror saw x-berth-certsd %v, want the configured header on its requests", h)
	}
	if _, err := pull(t, d, own+"/berth/busybox:certsd", nil); err == nil {
		t.Errorf("a host berth's own table configures without mirrors was pulled through _default's mirror")
	}
	if _, err := pull(t, d, digestOnly+"/berth/busybox:certsd", nil); err == nil || len(pullOnly.Requests()) != pushed {
		t.Errorf("a tag was resolved through a mirror without the resolve capability: %v, mirror saw %v", err, pullOnly.Requests()[pushed:])
	}
	if id, err := pull(t, d, digestOnly+"/berth/busybox@"+p.Digest, nil); err != nil || id != p.ID || len(pullOnly.Requests()) == pushed {
		t.Errorf("PullImage by digest through the pull-only mirror = %q, %v; want %s fetched from the mirror", id, err, p.ID)
	}
	out, err := d.Berthctl("info")
	if err != nil || !strings.Contains(out, "registry:       "+unreachable+": mirrors "+live.URL()) {
		t.Errorf("berthctl info = %v:\n%s", err, out)
	}
}

// TestSIGHUPReloadsRegistries: a mirror added to the hosts folder, then one
// added to berth's own file, is used after SIGHUP, without a restart; a
// broken file then changes nothing.
func TestSIGHUPReloadsRegistries(t *testing.T) {
	harness.RequireIntegration(t)
	live := harness.NewRegistry(t)
	p := live.Push(t, "berth/busybox:hup", harness.BusyboxImage(t, harness.ImageSpec{}))
	unreachable := harness.FreePort(t)
	ref := unreachable + "/berth/busybox:hup"
	dir := t.TempDir()
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: "[registry]\nconfig_path = \"" + dir + "\"\n"})
	pid := d.PID()

	if _, err := pull(t, d, ref, nil); err == nil {
		t.Fatalf("pull of %s with no mirror succeeded", ref)
	}
	writeHostsTOML(t, dir, unreachable, "[host.\""+live.URL()+"\"]\n")
	hup := func(want string) {
		t.Helper()
		before := strings.Count(d.Logs(), want)
		d.Signal(syscall.SIGHUP)
		if !eventually(10*time.Second, func() bool { return strings.Count(d.Logs(), want) > before }) {
			t.Fatalf("no %q after SIGHUP:\n%s", want, d.Logs())
		}
	}
	hup("registry settings reloaded")
	if id, err := pull(t, d, ref, nil); err != nil || id != p.ID {
		t.Fatalf("PullImage(%s) after SIGHUP = %q, %v; want %s through the new mirror", ref, id, err, p.ID)
	}
	if d.PID() != pid || !d.Running() {
		t.Fatal("berthd restarted on SIGHUP")
	}

	// A [registry."HOST"] table added to berth's own file is read again too.
	own := harness.FreePort(t)
	ownRef := own + "/berth/busybox:hup"
	if _, err := pull(t, d, ownRef, nil); err == nil {
		t.Fatalf("pull of %s with no mirror succeeded", ownRef)
	}
	f, err := os.OpenFile(d.Config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("\n[registry.\"" + own + "\"]\nmirrors = [\"" + live.URL() + "\"]\n")
	if cerr := f.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	hup("registry settings reloaded")
	if id, err := pull(t, d, ownRef, nil); err != nil || id != p.ID {
		t.Fatalf("PullImage(%s) after SIGHUP = %q, %v; want %s through the mirror of berth's own table", ownRef, id, err, p.ID)
	}

	// A broken hosts.toml is refused whole: the mirror stays.
	writeHostsTOML(t, dir, unreachable, "[host.\""+live.URL()+"\"]\noverride_path = true\n")
	hup("registry settings not reloaded")
	if _, err := d.Images.RemoveImage(t.Context(), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	if id, err := pull(t, d, ref, nil); err != nil || id != p.ID {
		t.Errorf("PullImage(%s) after a refused reload = %q, %v; want the old mirror still used", ref, id, err)
	}
}

// TestHostsHeadersStayWithTheirHost: a registry that redirects its blob GETs
// to storage on another port gets the headers its hosts.toml configures,
// and the storage gets none of them, nor the CRI credentials, whether the
// registry is open or asks for basic or bearer auth (#21); the pulls succeed.
func TestHostsHeadersStayWithTheirHost(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	const user, pass = "alice", "s3cret"
	dir := t.TempDir()
	type registry struct {
		name    string
		reg     *harness.Registry
		header  string // the configured header whose value is "from-hosts-toml"
		auth    *runtimeapi.AuthConfig
		pushed  harness.Pushed
		storage *harness.BlobStorage
	}
	regs := []*registry{
		{name: "open", reg: harness.NewRegistry(t), header: "Authorization"}, // as seen in the audit
		{name: "basic", reg: harness.NewRegistry(t, harness.WithBasicAuth(user, pass)), header: "X-Berth-Secret"},
		{name: "bearer", reg: harness.NewRegistry(t, harness.WithBearerAuth(user, pass)), header: "X-Berth-Secret"},
	}
	for _, r := range regs {
		r.pushed = r.reg.Push(t, "berth/busybox:"+r.name, img)
		r.storage = r.reg.RedirectBlobs(t)
		if r.name != "open" {
			r.auth = &runtimeapi.AuthConfig{Username: user, Password: pass, ServerAddress: r.reg.Host()}
		}
		writeHostsTOML(t, dir, r.reg.Host(), "server = \""+r.reg.URL()+"\"\n[header]\n  "+
			strings.ToLower(r.header)+" = \"from-hosts-toml\"\n")
	}
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: "[registry]\nconfig_path = \"" + dir + "\"\n"})

	for _, r := range regs {
		if id, err := pull(t, d, r.pushed.Name, r.auth); err != nil || id != r.pushed.ID {
			t.Fatalf("%s: PullImage(%s) with its blobs redirected = %q, %v; want %s", r.name, r.pushed.Name, id, err, r.pushed.ID)
		}
		if r.storage.Requests() == 0 {
			t.Errorf("%s: the blobs were not fetched from the storage the registry redirects to", r.name)
		}
		if h := r.reg.HeaderValues(r.header); !slices.Contains(h, "from-hosts-toml") {
			t.Errorf("%s: the registry saw %s %q, want the configured header", r.name, r.header, h)
		}
		for _, name := range slices.Compact([]string{r.header, "Authorization"}) {
			if h := r.storage.HeaderValues(name); len(h) != 0 {
				t.Errorf("%s: the storage on %s, another port, got %s %q", r.name, r.storage.Host(), name, h)
			}
		}
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}
