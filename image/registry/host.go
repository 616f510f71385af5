// Package registry turns an image reference into the endpoints to fetch it from
// (configured mirrors first, then the registry host itself), each with its own
// transport (plain HTTP, custom CA, skipped verification) and credentials.
package registry

// Host is the configuration of one registry host, as written under
// [registry."HOST"] in berthd's config file.
type Host struct {
	// Mirrors are tried in order before the host itself. Each is a URL
	// ("http://127.0.0.1:5000", "https://mirror.example") or a bare host[:port].
	Mirrors []string `toml:"mirrors"`
	// PlainHTTP talks to this host over HTTP instead of HTTPS.
	PlainHTTP bool `toml:"plain_http"`
	// CAFile is a PEM bundle trusted in addition to the system roots.
	CAFile string `toml:"ca_file"`
	// SkipVerify disables TLS certificate verification for this host.
	SkipVerify bool `toml:"skip_verify"`
	// Username/Password are used when the CRI request carries no credentials.
	Username string `toml:"username"`
	Password string `toml:"password"`

	// What containerd's hosts.toml can say and berth's tables do not
	// (LoadHostsDir fills them in).

	// CAFiles are PEM bundles trusted in addition to CAFile.
	CAFiles []string `toml:"-"`
	// ClientCerts are [certificate, key] PEM file pairs offered to the host;
	// one file may hold both (then the pair names it twice).
	ClientCerts [][2]string `toml:"-"`
	// Headers are sent with every request to the host.
	Headers map[string][]string `toml:"-"`
	// PullOnly: the host serves blobs and manifests by digest but must not
	// resolve tags (a hosts.toml mirror without the "resolve" capability).
	PullOnly bool `toml:"-"`
}
