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
}
