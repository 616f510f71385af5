package registry

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeHosts(t *testing.T, dir, host, body string) string {
	t.Helper()
	d := filepath.Join(dir, host)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if body != "" {
		if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestLoadHostsDir(t *testing.T) {
	dir := t.TempDir()
	writeHosts(t, dir, "docker.io", `
server = "https://registry-1.docker.io"

[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
  [host."http://127.0.0.1:5000".header]
    x-mirror = "one"

[host."https://pull.example"]
  capabilities = ["pull"]
  skip_verify = true
  ca = "pull-ca.pem"
`)
	writeHosts(t, dir, "_default", `[host."https://fallback.example"]
`)
	legacy := writeHosts(t, dir, "legacy.example:5000", "")
	for _, f := range []string{"ca.crt", "client.cert", "client.key", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(legacy, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hosts, err := LoadHostsDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := hosts["docker.io"]
	if !slices.Equal(d.Mirrors, []string{"http://127.0.0.1:5000", "https://pull.example"}) {
		t.Errorf("docker.io mirrors = %v, want the file's order", d.Mirrors)
	}
	if m := hosts["127.0.0.1:5000"]; !m.PlainHTTP || m.PullOnly || !slices.Equal(m.Headers["x-mirror"], []string{"one"}) {
		t.Errorf("127.0.0.1:5000 = %+v", m)
	}
	if m := hosts["pull.example"]; !m.PullOnly || !m.SkipVerify || !slices.Equal(m.CAFiles, []string{filepath.Join(dir, "docker.io", "pull-ca.pem")}) {
		t.Errorf("pull.example = %+v, want pull-only, skip_verify and the CA beside hosts.toml", m)
	}
	if !slices.Equal(hosts[DefaultHost].Mirrors, []string{"https://fallback.example"}) {
		t.Errorf("_default = %+v", hosts[DefaultHost])
	}
	if l := hosts["legacy.example:5000"]; len(l.CAFiles) != 1 || len(l.ClientCerts) != 1 || l.ClientCerts[0][1] != filepath.Join(legacy, "client.key") {
		t.Errorf("docker-style folder = %+v", l)
	}

	// _default stands for hosts without their own entry; berth's own
	// tables win over the folder's.
	r := &Resolver{hosts: MergeHosts(map[string]Host{"docker.io": {Mirrors: []string{"own.example"}}}, hosts)}
	if got := r.config("quay.io").Mirrors; !slices.Equal(got, []string{"https://fallback.example"}) {
		t.Errorf("quay.io mirrors = %v, want _default's", got)
	}
	if got := r.config("docker.io").Mirrors; !slices.Equal(got, []string{"own.example"}) {
		t.Errorf("docker.io mirrors = %v, want berth's own table's", got)
	}
}

func TestLoadHostsDirRefuses(t *testing.T) {
	for name, body := range map[string]string{
		"override_path":   "[host.\"https://m.example/v2/x\"]\noverride_path = true\n",
		"unknown key":     "[host.\"https://m.example\"]\ndial_timeout = \"1s\"\n",
		"other server":    "server = \"https://elsewhere.example\"\n",
		"no pull":         "[host.\"https://m.example\"]\ncapabilities = [\"resolve\"]\n",
		"bad capability":  "[host.\"https://m.example\"]\ncapabilities = [\"pull\", \"fly\"]\n",
		"mirror path":     "[host.\"https://m.example/some/path\"]\n",
		"toml syntax":     "[host.\"https://m.example\"\n",
		"client not pair": "[host.\"https://m.example\"]\nclient = [\"a\", \"b\", \"c\"]\n",
	} {
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			dir := t.TempDir()
			writeHosts(t, dir, "r.example", body)
			if _, err := LoadHostsDir(dir); err == nil || !strings.Contains(err.Error(), "hosts.toml") {
				t.Errorf("LoadHostsDir = %v, want an error naming the file", err)
			}
		})
	}
}
