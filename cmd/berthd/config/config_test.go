package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/image/registry"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "berth test CA"},
		NotBefore:    time.Now(),
		NotAfter:     time.Now().Add(time.Hour),
		IsCA:         true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaults(t *testing.T) {
	absent := filepath.Join(t.TempDir(), "absent.toml")
	c, err := Load(absent, false)
	if err != nil {
		t.Fatalf("missing file at the default path: %v", err)
	}
	want := &Config{Path: absent,
		Root: "/var/lib/berth", State: "/run/berth", Socket: "/run/berth/berth.sock",
		LogLevel: "info", LogFormat: "text", CgroupDriver: "cgroupfs", HostPathTimeout: Duration{10 * time.Second},
		Image: Image{PullProgressTimeout: Duration{time.Minute}, MaxLayerBytes: 32 << 30, MaxLayerEntries: 500_000, GzipDecoder: "auto",
			LazyFetchQuiet: Duration{5 * time.Second}},
		Network: Network{Mode: "bridge", Bridge: "berth0", Subnet: "10.89.0.0/16", MTU: 1500, Masquerade: true,
			CNIConfDir: "/etc/cni/net.d", CNIBinDirs: []string{"/opt/cni/bin"}},
		Stream:  Stream{Address: "127.0.0.1", IdleTimeout: Duration{4 * time.Hour}},
		Tracing: Tracing{SamplingRate: 1},
		CDI:     CDI{SpecDirs: []string{"/etc/cdi", "/var/run/cdi"}},
		NRI: NRI{Disable: true, SocketPath: "/var/run/nri/nri.sock", PluginPath: "/opt/nri/plugins", PluginConfigPath: "/etc/nri/conf.d",
			PluginRegistrationTimeout: Duration{5 * time.Second}, PluginRequestTimeout: Duration{2 * time.Second}},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults = %+v, want %+v", c, want)
	}
	if err := Default().validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

func TestMissingExplicitFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "absent.toml")
	_, err := Load(p, true)
	if err == nil || !strings.Contains(err.Error(), p) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(%s, mustExist) = %v, want a not-exist error naming the file", p, err)
	}
	if _, err := FromArgs([]string{"--config", p}, io.Discard); err == nil {
		t.Fatal("--config with a missing file: no error")
	}
}

func TestFullFile(t *testing.T) {
	ca := writeCA(t)
	p := writeConfig(t, `
root = "/srv/berth"
state = "/run/b"
socket = "/run/b/b.sock"
log_level = "debug"
log_format = "json"
cgroup_driver = "systemd"
host_path_timeout = "3s"

[image]
pull_progress_timeout = "90s"
max_layer_bytes = 1073741824
max_layer_entries = 1000
max_concurrent_downloads = 3
lazy = true
max_lazy_fetches = 2
lazy_fetch_quiet = "1s"
lazy_cache_max_bytes = 10737418240
gzip_decoder = "builtin"

[stream]
address = "0.0.0.0"
port = 10010
idle_timeout = "1h"

[network]
mode = "cni"
cni_conf_dir = "/etc/berth/cni"
cni_bin_dirs = ["/usr/lib/cni", "/opt/cni/bin"]
cni_cache_dir = "/var/cache/berth-cni"

[cdi]
spec_dirs = ["/etc/cdi", "/run/vendor-cdi"]

[nri]
disable = false
socket_path = "/run/nri/berth.sock"
plugin_path = "/usr/libexec/nri"
plugin_config_path = "/etc/berth/nri"
plugin_registration_timeout = "10s"
plugin_request_timeout = "500ms"
disable_connections = true

[registry."docker.io"]
mirrors = ["https://mirror.example/v2", "127.0.0.1:5000", "http://[::1]:5001"]
username = "u"
password = "p"

[registry."127.0.0.1:5000"]
plain_http = true

[registry."reg.internal"]
ca_file = "`+ca+`"
skip_verify = false
`)
	c, err := Load(p, true)
	if err != nil {
		t.Fatal(err)
	}
	three, two := 3, 2
	tenGiB := int64(10 << 30)
	want := &Config{
		Root: "/srv/berth", State: "/run/b", Socket: "/run/b/b.sock",
		LogLevel: "debug", LogFormat: "json", CgroupDriver: "systemd", HostPathTimeout: Duration{3 * time.Second},
		Image: Image{PullProgressTimeout: Duration{90 * time.Second}, MaxLayerBytes: 1 << 30, MaxLayerEntries: 1000, GzipDecoder: "builtin",
			MaxConcurrentDownloads: &three, Lazy: true, MaxLazyFetches: &two, LazyCacheMaxBytes: &tenGiB, LazyFetchQuiet: Duration{time.Second}},
		Network: Network{Mode: "cni", Bridge: "berth0", Subnet: "10.89.0.0/16", MTU: 1500, Masquerade: true,
			CNIConfDir: "/etc/berth/cni", CNIBinDirs: []string{"/usr/lib/cni", "/opt/cni/bin"}, CNICacheDir: "/var/cache/berth-cni"},
		Stream:  Stream{Address: "0.0.0.0", Port: 10010, IdleTimeout: Duration{time.Hour}},
		Tracing: Tracing{SamplingRate: 1},
		CDI:     CDI{SpecDirs: []string{"/etc/cdi", "/run/vendor-cdi"}},
		NRI: NRI{SocketPath: "/run/nri/berth.sock", PluginPath: "/usr/libexec/nri", PluginConfigPath: "/etc/berth/nri",
			PluginRegistrationTimeout: Duration{10 * time.Second}, PluginRequestTimeout: Duration{500 * time.Millisecond},
			DisableConnections: true},
		Registries: map[string]registry.Host{
			"docker.io": {
				Mirrors:  []string{"https://mirror.example/v2", "127.0.0.1:5000", "http://[::1]:5001"},
				Username: "u", Password: "p",
			},
			"127.0.0.1:5000": {PlainHTTP: true},
			"reg.internal":   {CAFile: ca},
		},
		Path: p, PathMustExist: true,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
}

// Every rejected file must produce an error that names the file, the key and
// (where there is one) the value.
func TestBadFiles(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, body string
		want       []string
	}{
		{"unknown top key", `rooot = "/x"`, []string{`unknown key "rooot"`}},
		{"unknown nested key", "[image]\npul_timeout = \"1m\"", []string{`unknown key "image.pul_timeout"`}},
		{"unknown registry key", "[registry.\"r.example\"]\nmirror = [\"x\"]", []string{`unknown key "registry."r.example".mirror"`}},
		{"unknown table", "[networking]\nbridge = \"b\"", []string{`unknown key "networking`}},
		{"bad subnet", "[network]\nsubnet = \"10.0.0.0\"", []string{`network.subnet = "10.0.0.0"`, "CIDR"}},
		{"tiny subnet", "[network]\nsubnet = \"10.0.0.0/30\"", []string{`network.subnet`, "too small"}},
		{"IPv4 subnet6", "[network]\nsubnet6 = \"10.0.0.0/16\"", []string{`network.subnet6 = "10.0.0.0/16"`, "IPv6"}},
		{"host bits in subnet6", "[network]\nsubnet6 = \"fd00::1/64\"", []string{`network.subnet6`, "IPv6 network"}},
		{"tiny subnet6", "[network]\nsubnet6 = \"fd00::/124\"", []string{`network.subnet6`, "too small"}},
		{"link-local subnet6", "[network]\nsubnet = \"10.89.0.0/16\"\nsubnet6 = \"fe80::/64\"", []string{`network.subnet6 = "fe80::/64"`, "link-local"}},
		{"subnet6 alone", "[network]\nsubnet6 = \"fd00::/64\"", []string{`network.subnet6`, "needs network.subnet"}},
		{"mtu under IPv6's", "[network]\nsubnet = \"10.89.0.0/16\"\nsubnet6 = \"fd00::/64\"\nmtu = 1000", []string{`network.mtu = "1000"`, "1280"}},
		{"bad mtu", "[network]\nmtu = 100", []string{`network.mtu = "100"`}},
		{"bad bridge", "[network]\nbridge = \"a/b\"", []string{`network.bridge = "a/b"`}},
		{"network mode", "[network]\nmode = \"calico\"", []string{`network.mode = "calico"`, "bridge, cni"}},
		{"empty network mode", "[network]\nmode = \"\"", []string{`network.mode = ""`, "bridge, cni"}},
		{"unknown network key", "[network]\ncni_dir = \"/x\"", []string{`unknown key "network.cni_dir"`}},
		{"relative cni conf dir", "[network]\ncni_conf_dir = \"net.d\"", []string{`network.cni_conf_dir = "net.d"`, "absolute"}},
		{"relative cni bin dir", "[network]\ncni_bin_dirs = [\"/opt/cni/bin\", \"bin\"]", []string{`network.cni_bin_dirs[1] = "bin"`, "absolute"}},
		{"no cni bin dir", "[network]\ncni_bin_dirs = []", []string{`network.cni_bin_dirs`, "at least one"}},
		{"cni bin dirs not a list", "[network]\ncni_bin_dirs = \"/opt/cni/bin\"", []string{"cni_bin_dirs"}},
		{"relative cdi spec dir", "[cdi]\nspec_dirs = [\"/etc/cdi\", \"cdi\"]", []string{`cdi.spec_dirs[1] = "cdi"`, "absolute"}},
		{"cdi spec dir twice", "[cdi]\nspec_dirs = [\"/etc/cdi\", \"/etc/cdi\"]", []string{`cdi.spec_dirs[1] = "/etc/cdi"`, "twice"}},
		{"relative nri plugin path", "[nri]\nplugin_path = \"nri\"", []string{`nri.plugin_path = "nri"`, "absolute"}},
		{"relative nri socket", "[nri]\nsocket_path = \"nri.sock\"", []string{`nri.socket_path = "nri.sock"`, "absolute"}},
		{"zero nri request timeout", "[nri]\nplugin_request_timeout = \"0s\"", []string{`nri.plugin_request_timeout = "0s"`, "greater than 0"}},
		{"nri timeout as a number", "[nri]\nplugin_registration_timeout = 5", []string{"plugin_registration_timeout"}},
		{"unknown nri key", "[nri]\nenable = true", []string{`unknown key "nri.enable"`}},
		{"cdi spec dirs not a list", "[cdi]\nspec_dirs = \"/etc/cdi\"", []string{"spec_dirs"}},
		{"unknown cdi key", "[cdi]\nspec_dir = [\"/etc/cdi\"]", []string{`unknown key "cdi.spec_dir"`}},
		{"relative cni cache dir", "[network]\ncni_cache_dir = \"cache\"", []string{`network.cni_cache_dir = "cache"`, "absolute"}},
		{"log level", `log_level = "verbose"`, []string{`log_level = "verbose"`, "debug, info, warn, error"}},
		{"log format", `log_format = "xml"`, []string{`log_format = "xml"`, "text, json"}},
		{"cgroup driver", `cgroup_driver = "cgroupv2"`, []string{`cgroup_driver = "cgroupv2"`, "cgroupfs, systemd"}},
		{"relative root", `root = "var/lib/berth"`, []string{`root = "var/lib/berth"`, "absolute"}},
		{"relative state", `state = "run"`, []string{`state = "run"`, "absolute"}},
		{"long socket", `socket = "/` + strings.Repeat("s", 120) + `"`, []string{"socket = ", "107 bytes"}},
		{"wrong type", `root = 5`, []string{"root"}},
		{"bad duration", "[image]\npull_progress_timeout = \"soon\"", []string{"pull_progress_timeout", `"soon"`}},
		{"integer duration", "[image]\npull_progress_timeout = 60", []string{"pull_progress_timeout"}},
		{"zero duration", "[image]\npull_progress_timeout = \"0s\"", []string{`image.pull_progress_timeout = "0s"`, "greater than 0"}},
		{"negative duration", "[image]\npull_progress_timeout = \"-1m\"", []string{`image.pull_progress_timeout = "-1m0s"`}},
		{"negative quiet", "[image]\nlazy_fetch_quiet = \"-1s\"", []string{`image.lazy_fetch_quiet = "-1s"`, "negative"}},
		{"zero host path timeout", `host_path_timeout = "0s"`, []string{`host_path_timeout = "0s"`, "greater than 0"}},
		{"credentials over plain http", "[registry.\"reg.example\"]\nplain_http = true\nusername = \"u\"\npassword = \"p\"",
			[]string{`registry."reg.example".username = "u"`, "never sent over plain HTTP"}},
		{"ca file is a device", "[registry.\"r.example\"]\nca_file = \"/dev/zero\"", []string{`ca_file = "/dev/zero"`, "not a regular file"}},
		{"zero layer bytes", "[image]\nmax_layer_bytes = 0", []string{`image.max_layer_bytes = "0"`, "greater than 0"}},
		{"negative layer entries", "[image]\nmax_layer_entries = -5", []string{`image.max_layer_entries = "-5"`, "greater than 0"}},
		{"zero concurrent downloads", "[image]\nmax_concurrent_downloads = 0", []string{`image.max_concurrent_downloads = "0"`, "greater than 0"}},
		{"negative concurrent downloads", "[image]\nmax_concurrent_downloads = -1", []string{`image.max_concurrent_downloads = "-1"`, "greater than 0"}},
		{"zero lazy fetches", "[image]\nmax_lazy_fetches = 0", []string{`image.max_lazy_fetches = "0"`, "greater than 0"}},
		{"negative lazy cache bound", "[image]\nlazy_cache_max_bytes = -1", []string{`image.lazy_cache_max_bytes = "-1"`, "greater than 0"}},
		{"lazy as a string", "[image]\nlazy = \"yes\"", []string{"lazy"}},
		{"unknown gzip decoder", "[image]\ngzip_decoder = \"igzip\"", []string{`image.gzip_decoder = "igzip"`, "auto, isa-l, builtin"}},
		{"layer bytes as a string", "[image]\nmax_layer_bytes = \"1GiB\"", []string{"max_layer_bytes"}},
		{"mirror scheme", "[registry.\"docker.io\"]\nmirrors = [\"ftp://m.example\"]",
			[]string{`registry."docker.io".mirrors[0] = "ftp://m.example"`, "http or https"}},
		{"mirror no host", "[registry.\"docker.io\"]\nmirrors = [\"https://\"]", []string{`mirrors[0] = "https://"`, "no host"}},
		{"mirror bad port", "[registry.\"docker.io\"]\nmirrors = [\"ok.example\", \"m.example:99999\"]",
			[]string{`mirrors[1] = "m.example:99999"`, "port"}},
		{"mirror path without scheme", "[registry.\"docker.io\"]\nmirrors = [\"m.example/v2\"]", []string{`mirrors[0] = "m.example/v2"`}},
		{"mirror credentials", "[registry.\"docker.io\"]\nmirrors = [\"https://u:p@m.example\"]", []string{"mirrors[0]", "credentials"}},
		{"ca file missing", "[registry.\"r.example\"]\nca_file = \"" + filepath.Join(dir, "nope.pem") + "\"",
			[]string{`registry."r.example".ca_file`, "nope.pem", "no such file"}},
		{"ca file not pem", "[registry.\"r.example\"]\nca_file = \"" + notPEM + "\"", []string{"ca_file", "not.pem", "no PEM"}},
		{"empty host", "[registry.\"\"]\nplain_http = true", []string{`registry.""`}},
		{"stream address", "[stream]\naddress = \"localhost\"", []string{`stream.address = "localhost"`, "IP address"}},
		{"stream port", "[stream]\nport = 70000", []string{`stream.port = "70000"`}},
		{"stream idle timeout", "[stream]\nidle_timeout = \"0s\"", []string{`stream.idle_timeout = "0s"`, "greater than 0"}},
		{"stream cert without key", "[stream]\ntls_cert = \"/etc/c.pem\"", []string{"stream.tls_cert", "together"}},
		{"stream cert missing", "[stream]\ntls_cert = \"" + filepath.Join(dir, "nope.pem") + "\"\ntls_key = \"" + notPEM + "\"", []string{"stream.tls_cert", "nope.pem"}},
		{"metrics host name", "[metrics]\naddress = \"localhost:9338\"", []string{`metrics.address = "localhost:9338"`, "IP:port"}},
		{"metrics no port", "[metrics]\naddress = \"127.0.0.1\"", []string{`metrics.address = "127.0.0.1"`}},
		{"tracing scheme", "[tracing]\nendpoint = \"grpc://c:4317\"", []string{`tracing.endpoint = "grpc://c:4317"`}},
		{"tracing no port", "[tracing]\nendpoint = \"http://collector\"", []string{`tracing.endpoint`, "host and port"}},
		{"tracing rate", "[tracing]\nsampling_rate = 1.5", []string{`tracing.sampling_rate = "1.5"`, "between 0 and 1"}},
		{"syntax", `root = "/x`, []string{"toml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeConfig(t, tt.body)
			_, err := Load(p, true)
			if err == nil {
				t.Fatalf("no error for %q", tt.body)
			}
			msg := err.Error()
			for _, w := range append([]string{"config " + p + ": "}, tt.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestFlagsOverrideFile(t *testing.T) {
	p := writeConfig(t, `
root = "/file/root"
state = "/file/state"
log_level = "debug"
cgroup_driver = "systemd"
`)
	c, err := FromArgs([]string{"--config", p, "--root", "/flag/root", "-log-format=json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Root != "/flag/root" || c.LogFormat != "json" {
		t.Errorf("flags not applied: root=%q log_format=%q", c.Root, c.LogFormat)
	}
	// Flags left unset must not reset file values to the flag defaults.
	if c.State != "/file/state" || c.LogLevel != "debug" || c.CgroupDriver != "systemd" {
		t.Errorf("file values lost: %+v", c)
	}
	if c.Socket != "/run/berth/berth.sock" {
		t.Errorf("socket = %q, want the default", c.Socket)
	}
}

func TestFlagsWithoutFile(t *testing.T) {
	// Not giving --config means DefaultPath, which may or may not exist on the
	// test host; only check a flag that the file cannot override.
	c, err := FromArgs([]string{"--config", writeConfig(t, ""), "--socket", "/tmp/x.sock", "--state", "/tmp/st",
		"--log-level", "warn"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/x.sock" || c.State != "/tmp/st" || c.LogLevel != "warn" || c.Root != "/var/lib/berth" {
		t.Errorf("got %+v", c)
	}
}

func TestBadFlags(t *testing.T) {
	p := writeConfig(t, "")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--log-level", "loud"}, `--log-level "loud": must be one of`},
		{[]string{"--log-format", "yaml"}, `--log-format "yaml"`},
		{[]string{"--root", "rel"}, `--root "rel": must be an absolute path`},
		{[]string{"--state", ""}, `--state "": must be an absolute path`},
		{[]string{"--socket", "/" + strings.Repeat("x", 200)}, "--socket"},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		_, err := FromArgs(append([]string{"--config", p}, tt.args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("FromArgs(%q) = %v, want error containing %q", tt.args, err, tt.want)
		}
	}
	if _, err := FromArgs([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestSlogLevel(t *testing.T) {
	for lvl, want := range map[string]string{"debug": "DEBUG", "info": "INFO", "warn": "WARN", "error": "ERROR"} {
		c := Default()
		c.LogLevel = lvl
		if got := c.SlogLevel().String(); got != want {
			t.Errorf("%s → %s, want %s", lvl, got, want)
		}
	}
}

// Only a subnet the file names outranks the kubelet's pod CIDR.
func TestSubnetSet(t *testing.T) {
	for body, want := range map[string]bool{
		"[network]\nmtu = 1400\n":                                            false,
		"[network]\nsubnet = \"10.89.0.0/16\"\n":                             true,
		"[network]\nsubnet = \"10.89.0.0/16\"\nsubnet6 = \"fd00:89::/64\"\n": true,
	} {
		c, err := Load(writeConfig(t, body), true)
		if err != nil {
			t.Fatal(err)
		}
		if c.Network.SubnetSet != want {
			t.Errorf("%q: SubnetSet = %v, want %v", body, c.Network.SubnetSet, want)
		}
	}
}

// An empty spec_dirs turns CDI off (no devices) rather than falling back
// to the defaults.
func TestCDINoSpecDirs(t *testing.T) {
	c, err := Load(writeConfig(t, "[cdi]\nspec_dirs = []\n"), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.CDI.SpecDirs) != 0 {
		t.Errorf("spec_dirs = %q, want none", c.CDI.SpecDirs)
	}
}
