// Package config loads berthd's settings: defaults, then the TOML file, then the
// command-line flags that were actually given. Every bad value is reported with
// the key (or flag) and the value, so a typo never silently falls back to a default.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/berth-runtime/berth/image/gunzip"
	"github.com/berth-runtime/berth/image/registry"
)

// DefaultPath is where berthd looks for its config file when --config is not given.
const DefaultPath = "/etc/berth/config.toml"

// Config is berthd's complete configuration.
type Config struct {
	Root         string `toml:"root"`
	State        string `toml:"state"`
	Socket       string `toml:"socket"`
	LogLevel     string `toml:"log_level"`
	LogFormat    string `toml:"log_format"`
	CgroupDriver string `toml:"cgroup_driver"`
	// ShimBinary is the berth-shim to run per pod; empty means the one
	// installed beside berthd.
	ShimBinary string `toml:"shim_binary"`
	// HostPathTimeout bounds the look at a volume's or device's host path
	// (a hung NFS or FUSE mount); see sandbox/spec's hostPathTimeout.
	HostPathTimeout Duration   `toml:"host_path_timeout"`
	Image           Image      `toml:"image"`
	Network         Network    `toml:"network"`
	Stream          Stream     `toml:"stream"`
	Metrics         Metrics    `toml:"metrics"`
	Tracing         Tracing    `toml:"tracing"`
	CDI             CDI        `toml:"cdi"`
	Storage         Storage    `toml:"storage"`
	Checkpoint      Checkpoint `toml:"checkpoint"`
	NRI             NRI        `toml:"nri"`
	// Registries is keyed by registry host ("docker.io", "127.0.0.1:5000"):
	// the [registry."HOST"] tables over the hosts of RegistryConfigPath.
	Registries map[string]registry.Host `toml:"-"`
	// RegistryConfigPath is [registry] config_path: a containerd certs.d
	// folder (hosts.toml per registry host).
	RegistryConfigPath string `toml:"-"`
	// RawRegistry is the [registry] table as written: config_path and one
	// table per host, told apart by decodeRegistry.
	RawRegistry map[string]toml.Primitive `toml:"registry"`

	// Path is the file the configuration was read from (reloaded on
	// SIGHUP), and PathMustExist whether it had to exist.
	Path          string `toml:"-"`
	PathMustExist bool   `toml:"-"`
}

// Network holds the [network] table: which pod network (Mode), the
// built-in bridge network's settings and the CNI folders.
type Network struct {
	// Mode is "bridge" (the built-in network) or "cni".
	Mode   string `toml:"mode"`
	Bridge string `toml:"bridge"`
	Subnet string `toml:"subnet"`
	// Subnet6 is the IPv6 pod subnet: with one, pods get an IPv6 address
	// too (dual-stack). None by default.
	Subnet6 string `toml:"subnet6"`
	// SubnetSet says the file set Subnet or Subnet6: then the kubelet's pod
	// CIDR does not replace them.
	SubnetSet bool `toml:"-"`
	// subnet4Set says the file set Subnet itself (subnet6 needs it).
	subnet4Set bool
	MTU        int  `toml:"mtu"`
	Masquerade bool `toml:"masquerade"`
	// CNIConfDir holds the CNI network configurations; the first in
	// lexical order is used.
	CNIConfDir string `toml:"cni_conf_dir"`
	// CNIBinDirs are searched in order for plugin binaries.
	CNIBinDirs []string `toml:"cni_bin_dirs"`
	// CNICacheDir is libcni's cache of results; empty means ROOT/network/cni/cache.
	CNICacheDir string `toml:"cni_cache_dir"`
}

// Network modes.
const (
	NetworkBridge = "bridge"
	NetworkCNI    = "cni"
)

// Stream holds the [stream] table: the server behind the URLs that Exec,
// Attach and PortForward return (the kubelet proxies clients to it).
type Stream struct {
	Address string `toml:"address"`
	// Port 0 takes a free port at every start.
	Port        int      `toml:"port"`
	IdleTimeout Duration `toml:"idle_timeout"`
	// TLSCert and TLSKey (both or neither) serve https.
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
}

// Metrics holds the [metrics] table.
type Metrics struct {
	// Address is the host:port of the Prometheus endpoint (/metrics);
	// empty: no endpoint.
	Address string `toml:"address"`
}

// Tracing holds the [tracing] table.
type Tracing struct {
	// Endpoint is the OTLP/gRPC collector, "http://host:port" (plaintext)
	// or "https://host:port"; empty: no tracing.
	Endpoint string `toml:"endpoint"`
	// SamplingRate is the share of traces berthd starts that are recorded
	// (0 to 1); a call in a trace the caller samples is always recorded.
	SamplingRate float64 `toml:"sampling_rate"`
}

// CDI holds the [cdi] table.
type CDI struct {
	// SpecDirs are the folders of CDI specs, rescanned whenever a
	// container asks for CDI devices; a device defined in two folders is
	// taken from the later one. Empty: no CDI devices.
	SpecDirs []string `toml:"spec_dirs"`
}

// Storage holds the [storage] table.
type Storage struct {
	// ContainerRoot holds the containers' writable layers (the overlay
	// upper and work folders, CONTAINER_ROOT/containers/<id>), which may
	// lie on another filesystem than the image store under root (snapshots
	// and content): the kubelet's separate container filesystem. Empty:
	// root, the layout of nodes from before the key.
	ContainerRoot string `toml:"container_root"`
}

// Checkpoint holds the [checkpoint] table.
type Checkpoint struct {
	// CRIUConfig is a CRIU configuration file (criu(8), "Configuration
	// files") that every checkpoint takes, read at each. Empty: none, CRIU
	// runs with berth's options alone.
	CRIUConfig string `toml:"criu_config"`
}

// NRI holds the [nri] table: hosting Node Resource Interface plugins, with
// containerd's key names and meanings, so that a node's settings carry over.
type NRI struct {
	// Disable turns NRI off; true by default (see Default).
	Disable bool `toml:"disable"`
	// SocketPath is where plugins started outside berthd connect.
	SocketPath string `toml:"socket_path"`
	// PluginPath holds the plugins berthd starts itself (IDX-NAME).
	PluginPath string `toml:"plugin_path"`
	// PluginConfigPath holds the configuration of the plugins berthd starts.
	PluginConfigPath string `toml:"plugin_config_path"`
	// PluginRegistrationTimeout bounds a plugin's registration.
	PluginRegistrationTimeout Duration `toml:"plugin_registration_timeout"`
	// PluginRequestTimeout bounds each request to a plugin: one that does
	// not answer in time is dropped.
	PluginRequestTimeout Duration `toml:"plugin_request_timeout"`
	// DisableConnections: only the plugins of plugin_path, no socket.
	DisableConnections bool `toml:"disable_connections"`
}

// ContainerRoot is where writable layers go: [storage] container_root, or
// root when unset (also root as --root set it).
func (c *Config) ContainerRoot() string {
	if c.Storage.ContainerRoot != "" {
		return c.Storage.ContainerRoot
	}
	return c.Root
}

// Image holds the [image] table.
type Image struct {
	// PullProgressTimeout cancels a pull that receives no bytes for this long.
	PullProgressTimeout Duration `toml:"pull_progress_timeout"`
	// MaxLayerBytes bounds a layer's uncompressed tar stream, and the file
	// sizes it declares (sparse files in full): a decompression bomb stops there.
	MaxLayerBytes int64 `toml:"max_layer_bytes"`
	// MaxLayerEntries bounds the tar entries (files, dirs, links) of a layer.
	MaxLayerEntries int64 `toml:"max_layer_entries"`
	// MaxConcurrentDownloads bounds the layer downloads (connections, the
	// parts of a ranged one included) of all pulls of the node together.
	// Unset: no node-wide bound, each pull fetching up to 4 layers at once.
	MaxConcurrentDownloads *int `toml:"max_concurrent_downloads"`
	// GzipDecoder inflates gzip layers: "auto" (ISA-L where it loads and
	// is the faster on this CPU, measured at start), "isa-l" or "builtin".
	GzipDecoder string `toml:"gzip_decoder"`
	// Lazy mounts eStargz layers (those whose descriptor names a TOC
	// digest) as FUSE filesystems that fetch files on first read, and
	// starts containers before the rest is fetched. Off by default: see
	// docs/configuration.md. It needs /dev/fuse.
	Lazy bool `toml:"lazy"`
	// MaxLazyFetches bounds the background requests that complete lazy
	// layers, of all layers together. Unset: 4.
	MaxLazyFetches *int `toml:"max_lazy_fetches"`
	// LazyFetchQuiet holds those background requests until no container
	// read or pull has fetched on demand for this long; 0: no hold.
	LazyFetchQuiet Duration `toml:"lazy_fetch_quiet"`
	// LazyCacheMaxBytes bounds the disk the lazily pulled layers take
	// together, each counted at its full unpacked size; a layer past it
	// is pulled whole. Unset: no bound.
	LazyCacheMaxBytes *int64 `toml:"lazy_cache_max_bytes"`
}

// LazyCacheBound is lazy_cache_max_bytes, 0 when unset (no bound).
func (i Image) LazyCacheBound() int64 {
	if i.LazyCacheMaxBytes == nil {
		return 0
	}
	return *i.LazyCacheMaxBytes
}

// LazyFetchBound is max_lazy_fetches, 0 when unset (the image package's default).
func (i Image) LazyFetchBound() int {
	if i.MaxLazyFetches == nil {
		return 0
	}
	return *i.MaxLazyFetches
}

// DownloadBound is max_concurrent_downloads, 0 when unset (no bound).
func (i Image) DownloadBound() int {
	if i.MaxConcurrentDownloads == nil {
		return 0
	}
	return *i.MaxConcurrentDownloads
}

// Default layer bounds: above any real image's layer, far below what would
// fill a node's disk or inode table by surprise.
const (
	DefaultMaxLayerBytes   = 32 << 30
	DefaultMaxLayerEntries = 500_000
)

// Duration is a time.Duration written as a Go duration string ("90s", "2m") in
// TOML. A bare integer is refused: it would silently mean nanoseconds.
type Duration struct{ time.Duration }

// UnmarshalText parses a duration string; validation of the range is done later,
// where the key name is known.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (want e.g. \"90s\", \"2m\")", b)
	}
	d.Duration = v
	return nil
}

// MarshalText keeps the config printable as TOML.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// DefaultLazyFetchQuiet is lazy_fetch_quiet's default: stargz-snapshotter's
// hold of its background fetch after the last prioritised task.
const DefaultLazyFetchQuiet = 5 * time.Second

// Default returns the configuration used when neither file nor flags say otherwise.
func Default() *Config {
	return &Config{
		Root:            "/var/lib/berth",
		State:           "/run/berth",
		Socket:          "/run/berth/berth.sock",
		LogLevel:        "info",
		LogFormat:       "text",
		CgroupDriver:    "cgroupfs",
		HostPathTimeout: Duration{10 * time.Second},
		Image: Image{PullProgressTimeout: Duration{time.Minute}, LazyFetchQuiet: Duration{DefaultLazyFetchQuiet},
			MaxLayerBytes: DefaultMaxLayerBytes, MaxLayerEntries: DefaultMaxLayerEntries, GzipDecoder: gunzip.Auto},
		Network: Network{Mode: NetworkBridge, Bridge: "berth0", Subnet: "10.89.0.0/16", MTU: 1500, Masquerade: true,
			CNIConfDir: "/etc/cni/net.d", CNIBinDirs: []string{"/opt/cni/bin"}},
		Stream:  Stream{Address: "127.0.0.1", IdleTimeout: Duration{4 * time.Hour}},
		Tracing: Tracing{SamplingRate: 1},
		// The CDI specification's folders: static specs, then those
		// drivers write at run time.
		CDI: CDI{SpecDirs: []string{"/etc/cdi", "/var/run/cdi"}},
		// Off unless the operator turns it on: its socket lets any process
		// that reaches it change every container of the node.
		NRI: DefaultNRI(),
	}
}

// DefaultNRI is the [nri] table's defaults, containerd's paths and timeouts.
func DefaultNRI() NRI {
	return NRI{Disable: true, SocketPath: "/var/run/nri/nri.sock", PluginPath: "/opt/nri/plugins",
		PluginConfigPath: "/etc/nri/conf.d", PluginRegistrationTimeout: Duration{5 * time.Second},
		PluginRequestTimeout: Duration{2 * time.Second}}
}

// Load reads the TOML file at path over the defaults. When mustExist is false a
// missing file is not an error (berthd runs without one at the default path).
func Load(path string, mustExist bool) (*Config, error) {
	c, err := load(path, mustExist)
	if c != nil {
		c.Path, c.PathMustExist = path, mustExist
	}
	return c, err
}

func load(path string, mustExist bool) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !mustExist {
			return Default(), nil
		}
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already named once
		}
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c, md, err := decode(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		// Not %q: a registry key already carries its own quotes (registry."h".mirror).
		return nil, fmt.Errorf("config %s: unknown key \"%s\"", path, un[0].String())
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// decode reads a file's bytes over the defaults, as berthd reads them.
func decode(b []byte) (*Config, toml.MetaData, error) {
	c := Default()
	md, err := toml.Decode(string(b), c)
	if err != nil {
		return nil, md, err
	}
	c.Network.subnet4Set = md.IsDefined("network", "subnet")
	c.Network.SubnetSet = c.Network.subnet4Set || md.IsDefined("network", "subnet6")
	return c, md, c.decodeRegistry(md)
}

// decodeRegistry splits [registry]: config_path, and a table per host.
func (c *Config) decodeRegistry(md toml.MetaData) error {
	c.Registries = map[string]registry.Host{}
	for k, prim := range c.RawRegistry {
		if k == "config_path" {
			if err := md.PrimitiveDecode(prim, &c.RegistryConfigPath); err != nil {
				return fmt.Errorf("registry.config_path: %w", err)
			}
			continue
		}
		var h registry.Host
		if err := md.PrimitiveDecode(prim, &h); err != nil {
			return fmt.Errorf("registry.%q: %w", k, err)
		}
		c.Registries[k] = h
	}
	c.RawRegistry = nil
	return nil
}

// SlogLevel maps the validated log_level to a slog level.
func (c *Config) SlogLevel() slog.Level {
	switch c.LogLevel {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}
