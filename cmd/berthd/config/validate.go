package config

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/berth-runtime/berth/image/gunzip"
	"github.com/berth-runtime/berth/image/registry"
	"github.com/berth-runtime/berth/network"
)

// maxSocketPath is sun_path (108 bytes) minus the terminating NUL: a longer
// socket path fails at bind time with a confusing "invalid argument".
const maxSocketPath = 107

var (
	logLevels     = []string{"debug", "info", "warn", "error"}
	logFormats    = []string{"text", "json"}
	cgroupDrivers = []string{"cgroupfs", "systemd"}
	networkModes  = []string{NetworkBridge, NetworkCNI}
)

// problems collects every bad value of a file, so that one run of
// berthd or `berthctl config check` reports them all.
type problems struct{ errs []error }

func (p *problems) add(err error) { p.errs = append(p.errs, err) }

// err is nil, or every problem joined, one a line.
func (p *problems) err() error { return errors.Join(p.errs...) }

// KeyError is a bad value of one key, named as written in the file
// (registry."docker.io".mirrors[0]).
type KeyError struct {
	Key   string
	Value string
	// Table: the key itself is wrong (a table name); Value is not shown.
	Table bool
	Err   error
}

func (e *KeyError) Error() string {
	if e.Table {
		return fmt.Sprintf("%s: %v", e.Key, e.Err)
	}
	return fmt.Sprintf("%s = %q: %v", e.Key, e.Value, e.Err)
}

func (e *KeyError) Unwrap() error { return e.Err }

// validate checks every value, naming the offending key as written in the file.
func (c *Config) validate() error {
	var p problems
	checks := []struct {
		key, val string
		check    func(string) error
	}{
		{"root", c.Root, absPath},
		{"state", c.State, absPath},
		{"socket", c.Socket, socketPath},
		{"log_level", c.LogLevel, oneOf(logLevels)},
		{"log_format", c.LogFormat, oneOf(logFormats)},
		{"cgroup_driver", c.CgroupDriver, oneOf(cgroupDrivers)},
	}
	for _, ch := range checks {
		if err := ch.check(ch.val); err != nil {
			p.add(badValue(ch.key, ch.val, err))
		}
	}
	if c.ShimBinary != "" {
		if err := absPath(c.ShimBinary); err != nil {
			p.add(badValue("shim_binary", c.ShimBinary, err))
		}
	}
	if r := c.Storage.ContainerRoot; r != "" {
		if err := absPath(r); err != nil {
			p.add(badValue("storage.container_root", r, err))
		}
	}
	if f := c.Checkpoint.CRIUConfig; f != "" {
		if err := absPath(f); err != nil {
			p.add(badValue("checkpoint.criu_config", f, err))
		}
	}
	c.Network.validate(&p)
	c.Stream.validate(&p)
	c.Tracing.validate(&p)
	c.CDI.validate(&p)
	c.NRI.validate(&p)
	if a := c.Metrics.Address; a != "" {
		if err := listenAddress(a); err != nil {
			p.add(badValue("metrics.address", a, err))
		}
	}
	if d := c.HostPathTimeout.Duration; d <= 0 {
		p.add(badValue("host_path_timeout", d.String(), errors.New("must be greater than 0")))
	}
	if d := c.Image.PullProgressTimeout.Duration; d <= 0 {
		p.add(badValue("image.pull_progress_timeout", d.String(), errors.New("must be greater than 0")))
	}
	if n := c.Image.MaxLayerBytes; n <= 0 {
		p.add(badValue("image.max_layer_bytes", strconv.FormatInt(n, 10), errors.New("must be greater than 0")))
	}
	if n := c.Image.MaxLayerEntries; n <= 0 {
		p.add(badValue("image.max_layer_entries", strconv.FormatInt(n, 10), errors.New("must be greater than 0")))
	}
	if m := c.Image.GzipDecoder; !slices.Contains(gunzip.Modes, m) {
		p.add(badValue("image.gzip_decoder", m, fmt.Errorf("must be one of %s", strings.Join(gunzip.Modes, ", "))))
	}
	if n := c.Image.MaxConcurrentDownloads; n != nil && *n <= 0 {
		p.add(badValue("image.max_concurrent_downloads", strconv.Itoa(*n), errors.New("must be greater than 0 (leave it out for no bound)")))
	}
	if d := c.Image.LazyFetchQuiet.Duration; d < 0 {
		p.add(badValue("image.lazy_fetch_quiet", d.String(), errors.New("must not be negative (0: no hold)")))
	}
	if n := c.Image.MaxLazyFetches; n != nil && *n <= 0 {
		p.add(badValue("image.max_lazy_fetches", strconv.Itoa(*n), errors.New("must be greater than 0 (leave it out for 4)")))
	}
	if n := c.Image.LazyCacheMaxBytes; n != nil && *n <= 0 {
		p.add(badValue("image.lazy_cache_max_bytes", strconv.FormatInt(*n, 10), errors.New("must be greater than 0 (leave it out for no bound)")))
	}
	// Sorted so that the same bad file always reports the same key first.
	hosts := make([]string, 0, len(c.Registries))
	for h := range c.Registries {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		validateHost(&p, h, c.Registries[h])
	}
	if c.RegistryConfigPath != "" {
		c.Registries = c.withHostsDir(&p)
	}
	return p.err()
}

// withHostsDir is Registries over the hosts of config_path, each checked as
// the registry resolver will use it (CA and client files read). berth's
// own tables win: a host they name is taken from them whole.
func (c *Config) withHostsDir(p *problems) map[string]registry.Host {
	bad := func(err error) map[string]registry.Host {
		p.add(badValue("registry.config_path", c.RegistryConfigPath, err))
		return c.Registries
	}
	if err := absPath(c.RegistryConfigPath); err != nil {
		return bad(err)
	}
	dir, err := registry.LoadHostsDir(c.RegistryConfigPath)
	if err != nil {
		return bad(err)
	}
	merged := registry.MergeHosts(c.Registries, dir)
	if _, err := registry.NewResolver(merged); err != nil {
		return bad(err)
	}
	return merged
}

func (s *Stream) validate(p *problems) {
	if net.ParseIP(s.Address) == nil {
		p.add(badValue("stream.address", s.Address, errors.New("must be an IP address")))
	}
	if s.Port < 0 || s.Port > 65535 {
		p.add(badValue("stream.port", strconv.Itoa(s.Port), errors.New("must be 0 (a free port) to 65535")))
	}
	if d := s.IdleTimeout.Duration; d <= 0 {
		p.add(badValue("stream.idle_timeout", d.String(), errors.New("must be greater than 0")))
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		p.add(badValue("stream.tls_cert", s.TLSCert, errors.New("tls_cert and tls_key go together")))
	}
	for _, f := range []struct{ key, val string }{{"stream.tls_cert", s.TLSCert}, {"stream.tls_key", s.TLSKey}} {
		if f.val == "" {
			continue
		}
		if err := absPath(f.val); err != nil {
			p.add(badValue(f.key, f.val, err))
		}
		if _, err := os.Stat(f.val); err != nil {
			p.add(badValue(f.key, f.val, err))
		}
	}
}

func (t Tracing) validate(p *problems) {
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https"):
			p.add(badValue("tracing.endpoint", t.Endpoint, errors.New("must be http://host:port (plaintext) or https://host:port")))
		case u.Port() == "" || (u.Path != "" && u.Path != "/") || u.User != nil:
			p.add(badValue("tracing.endpoint", t.Endpoint, errors.New("must be a collector's host and port, without path or credentials")))
		}
	}
	if r := t.SamplingRate; r < 0 || r > 1 || r != r {
		p.add(badValue("tracing.sampling_rate", strconv.FormatFloat(r, 'g', -1, 64), errors.New("must be between 0 and 1")))
	}
}

func (c CDI) validate(p *problems) {
	for i, d := range c.SpecDirs {
		key := fmt.Sprintf("cdi.spec_dirs[%d]", i)
		if err := absPath(d); err != nil {
			p.add(badValue(key, d, err))
		} else if slices.Contains(c.SpecDirs[:i], d) {
			p.add(badValue(key, d, errors.New("is named twice")))
		}
	}
}

func (n NRI) validate(p *problems) {
	for _, ch := range []struct {
		key, val string
		check    func(string) error
	}{{"nri.socket_path", n.SocketPath, socketPath}, {"nri.plugin_path", n.PluginPath, absPath},
		{"nri.plugin_config_path", n.PluginConfigPath, absPath}} {
		if err := ch.check(ch.val); err != nil {
			p.add(badValue(ch.key, ch.val, err))
		}
	}
	for _, t := range []struct {
		key string
		d   Duration
	}{{"nri.plugin_registration_timeout", n.PluginRegistrationTimeout}, {"nri.plugin_request_timeout", n.PluginRequestTimeout}} {
		if t.d.Duration <= 0 {
			p.add(badValue(t.key, t.d.String(), errors.New("must be greater than 0")))
		}
	}
}

// listenAddress is an IP address and a port: a host name would depend on
// the resolver at start, and an empty host listens on every address.
func listenAddress(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || net.ParseIP(host) == nil {
		return errors.New("must be IP:port, such as 127.0.0.1:9338")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number between 0 and 65535", port)
	}
	return nil
}

func badValue(key, val string, err error) error {
	return &KeyError{Key: key, Value: val, Err: err}
}

func absPath(p string) error {
	if !filepath.IsAbs(p) {
		return errors.New("must be an absolute path")
	}
	return nil
}

func socketPath(p string) error {
	if err := absPath(p); err != nil {
		return err
	}
	if len(p) > maxSocketPath {
		return fmt.Errorf("longer than %d bytes, the limit for a unix socket path", maxSocketPath)
	}
	return nil
}

func oneOf(allowed []string) func(string) error {
	return func(v string) error {
		if !slices.Contains(allowed, v) {
			return fmt.Errorf("must be one of %s", strings.Join(allowed, ", "))
		}
		return nil
	}
}

func validateHost(p *problems, host string, h registry.Host) {
	key := func(k string) string { return fmt.Sprintf("registry.%q.%s", host, k) }
	if host == "" || strings.ContainsAny(host, "/ ") {
		p.add(&KeyError{Key: fmt.Sprintf("registry.%q", host), Table: true, Err: errors.New("the table name must be a registry host[:port]")})
	}
	for i, m := range h.Mirrors {
		if err := mirror(m); err != nil {
			p.add(badValue(fmt.Sprintf("%s[%d]", key("mirrors"), i), m, err))
		}
	}
	if h.CAFile != "" {
		if err := caFile(h.CAFile); err != nil {
			p.add(badValue(key("ca_file"), h.CAFile, err))
		}
	}
	if h.Username != "" && h.PlainHTTP && !registry.IsLoopback(host) {
		p.add(badValue(key("username"), h.Username, errors.New("credentials are never sent over plain HTTP to another machine (plain_http = true)")))
	}
}

// mirror checks a mirror the way the registry resolver will read it, plus
// that its host[:port] is well formed.
func mirror(m string) error {
	host, _, err := registry.ParseMirror(m)
	if err != nil {
		return err
	}
	return validHostPort(host)
}

func validHostPort(hp string) error {
	if hp == "" {
		return errors.New("no host")
	}
	host, port := hp, ""
	if h, p, err := net.SplitHostPort(hp); err == nil {
		host, port = h, p
	} else if strings.Count(hp, ":") > 0 && !strings.HasPrefix(hp, "[") {
		return errors.New("not a host[:port]")
	}
	if host == "" {
		return errors.New("no host")
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q is not a number between 1 and 65535", port)
		}
	}
	return nil
}

// caFile is checked at startup so a wrong path fails berthd, not the first pull.
// maxCAFile bounds a CA bundle: the system's is a few hundred KiB.
const maxCAFile = 4 << 20

func caFile(p string) error {
	// A device or FIFO (/dev/zero, a pipe) would hang the start or fill
	// memory: only a regular file of bounded size is read.
	info, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() || info.Size() > maxCAFile {
		return fmt.Errorf("not a regular file of at most %d bytes", maxCAFile)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return errors.New("no PEM certificate in the file")
	}
	return nil
}

func (n Network) validate(p *problems) {
	if err := oneOf(networkModes)(n.Mode); err != nil {
		p.add(badValue("network.mode", n.Mode, err))
	}
	if err := absPath(n.CNIConfDir); err != nil {
		p.add(badValue("network.cni_conf_dir", n.CNIConfDir, err))
	}
	if len(n.CNIBinDirs) == 0 {
		p.add(badValue("network.cni_bin_dirs", "[]", errors.New("must name at least one folder")))
	}
	for i, d := range n.CNIBinDirs {
		if err := absPath(d); err != nil {
			p.add(badValue(fmt.Sprintf("network.cni_bin_dirs[%d]", i), d, err))
		}
	}
	if n.CNICacheDir != "" {
		if err := absPath(n.CNICacheDir); err != nil {
			p.add(badValue("network.cni_cache_dir", n.CNICacheDir, err))
		}
	}
	if n.Bridge == "" || len(n.Bridge) > 15 || strings.ContainsAny(n.Bridge, "/ :") {
		p.add(badValue("network.bridge", n.Bridge, errors.New("must be an interface name of 1 to 15 characters")))
	}
	// The network's own check, which the kubelet's pod CIDR passes too.
	if subnet, err := netip.ParsePrefix(n.Subnet); err != nil || !subnet.Addr().Is4() {
		p.add(badValue("network.subnet", n.Subnet, errors.New("must be an IPv4 CIDR such as 10.89.0.0/16")))
	} else if err := network.CheckSubnet(subnet); err != nil {
		p.add(badValue("network.subnet", n.Subnet, err))
	}
	if n.Subnet6 != "" {
		if !n.subnet4Set {
			// Alone, it would pin IPv4 to the default subnet on every node
			// and drop the kubelet's pod CIDR.
			p.add(badValue("network.subnet6", n.Subnet6, errors.New("needs network.subnet set too")))
		}
		if n.MTU < 1280 {
			p.add(badValue("network.mtu", strconv.Itoa(n.MTU), errors.New("must be at least 1280 with an IPv6 subnet (IPv6's minimum)")))
		}
		if subnet, err := netip.ParsePrefix(n.Subnet6); err != nil || !subnet.Addr().Is6() || subnet != subnet.Masked() {
			p.add(badValue("network.subnet6", n.Subnet6, errors.New("must be an IPv6 network such as fd00:89::/64")))
		} else if err := network.CheckSubnet(subnet); err != nil {
			p.add(badValue("network.subnet6", n.Subnet6, err))
		}
	}
	if n.MTU < 576 || n.MTU > 65535 {
		p.add(badValue("network.mtu", strconv.Itoa(n.MTU), errors.New("must be between 576 and 65535")))
	}
}
