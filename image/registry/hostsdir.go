package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// DefaultHost is the hosts-dir entry (containerd's "_default" folder) for
// every registry that has no entry of its own.
const DefaultHost = "_default"

// LoadHostsDir reads a containerd certs.d tree (config_path): one folder per
// registry host ("docker.io", "registry.example:5000", "_default"), each
// with a hosts.toml, or without one only the Docker-style certificate files
// (*.crt CAs, *.cert/*.key client pairs). Each [host."URL"] entry becomes a
// mirror of the folder's registry, in the file's order, with its own Host
// record; the top-level keys are for the registry itself (server). Keys
// berth does not carry out are errors naming the file and key, never skipped.
func LoadHostsDir(dir string) (map[string]Host, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]Host{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		hostDir := filepath.Join(dir, e.Name())
		if err := loadHostDir(out, e.Name(), hostDir); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hostsFile is hosts.toml; hostEntry is the top level and each [host."URL"].
type hostsFile struct {
	Server string               `toml:"server"`
	Hosts  map[string]hostEntry `toml:"host"`
	hostEntry
}

type hostEntry struct {
	Capabilities []string       `toml:"capabilities"`
	CA           any            `toml:"ca"`     // "file" or ["file", …]
	Client       any            `toml:"client"` // "pem", ["cert", "key"] or [["cert", "key"], …]
	SkipVerify   *bool          `toml:"skip_verify"`
	Header       map[string]any `toml:"header"` // value: "v" or ["v", …]
	OverridePath bool           `toml:"override_path"`
}

func loadHostDir(out map[string]Host, name, dir string) error {
	path := filepath.Join(dir, "hosts.toml")
	var f hostsFile
	md, err := toml.DecodeFile(path, &f)
	if errors.Is(err, fs.ErrNotExist) {
		return dockerCerts(out, name, dir)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err) // the error has the line
	}
	if un := md.Undecoded(); len(un) > 0 {
		return fmt.Errorf("%s: key \"%s\" is not supported by berth", path, un[0].String())
	}
	self, err := f.hostEntry.host(path, "", dir)
	if err != nil {
		return err
	}
	if f.Server != "" {
		u, err := url.Parse(f.Server)
		if err != nil || u.Host == "" {
			return fmt.Errorf("%s: server %q is not a URL", path, f.Server)
		}
		if name != DefaultHost && u.Host != name && !(name == "docker.io" && isDockerHub(u.Host)) {
			return fmt.Errorf("%s: server %q: berth fetches a registry from its own host (%s); make %s a [host] mirror instead", path, f.Server, name, u.Host)
		}
		self.PlainHTTP = u.Scheme == "http"
	}
	// [host."…"] in the file's order: md.Keys lists tables as written.
	for _, k := range md.Keys() {
		if len(k) != 2 || k[0] != "host" {
			continue
		}
		m, err := f.Hosts[k[1]].host(path, k[1], dir)
		if err != nil {
			return err
		}
		mhost, plain, err := ParseMirror(k[1])
		if err != nil {
			return fmt.Errorf("%s: host %q: %w", path, k[1], err)
		}
		m.PlainHTTP = plain
		if old, ok := out[mhost]; ok && !sameHost(old, m) {
			return fmt.Errorf("%s: host %q is also configured, differently, elsewhere in the hosts folder", path, k[1])
		}
		out[mhost] = m
		self.Mirrors = append(self.Mirrors, k[1])
	}
	out[name] = self
	return nil
}

func isDockerHub(h string) bool { return h == "registry-1.docker.io" || h == "index.docker.io" }

// host turns one entry into a Host; key is its [host."KEY"] ("" for the top level).
func (e hostEntry) host(path, key, dir string) (Host, error) {
	where := path
	if key != "" {
		where = fmt.Sprintf("%s: [host.%q]", path, key)
	}
	var h Host
	if e.OverridePath {
		return h, fmt.Errorf("%s: override_path is not supported: berth reaches a mirror at its registry root", where)
	}
	if e.Capabilities != nil {
		if slices.ContainsFunc(e.Capabilities, func(c string) bool { return c != "pull" && c != "resolve" && c != "push" }) {
			return h, fmt.Errorf("%s: capabilities %v: want pull, resolve, push", where, e.Capabilities)
		}
		if !slices.Contains(e.Capabilities, "pull") {
			return h, fmt.Errorf("%s: capabilities %v: a host berth may use must have pull", where, e.Capabilities)
		}
		h.PullOnly = !slices.Contains(e.Capabilities, "resolve")
	}
	if e.SkipVerify != nil {
		h.SkipVerify = *e.SkipVerify
	}
	cas, err := stringList(e.CA)
	if err != nil {
		return h, fmt.Errorf("%s: ca: %w", where, err)
	}
	for _, c := range cas {
		h.CAFiles = append(h.CAFiles, relTo(dir, c))
	}
	if h.ClientCerts, err = clientPairs(e.Client, dir); err != nil {
		return h, fmt.Errorf("%s: client: %w", where, err)
	}
	for name, v := range e.Header {
		vals, err := stringList(v)
		if err != nil {
			return h, fmt.Errorf("%s: header %q: %w", where, name, err)
		}
		if h.Headers == nil {
			h.Headers = map[string][]string{}
		}
		h.Headers[name] = vals
	}
	return h, nil
}

func stringList(v any) ([]string, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{v}, nil
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("want strings, got %v", x)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("want a string or a list of strings, got %v", v)
}

// clientPairs reads containerd's client forms: "both.pem", ["cert",
// "key"] or [["cert", "key"], …].
func clientPairs(v any, dir string) ([][2]string, error) {
	if s, ok := v.(string); ok {
		return [][2]string{{relTo(dir, s), relTo(dir, s)}}, nil
	}
	list, ok := v.([]any)
	if v == nil {
		return nil, nil
	}
	if !ok {
		return nil, fmt.Errorf("want a file, a [cert, key] pair or a list of pairs, got %v", v)
	}
	if flat, err := stringList(list); err == nil {
		if len(flat) != 2 {
			return nil, fmt.Errorf("a pair is [cert, key], got %v", flat)
		}
		return [][2]string{{relTo(dir, flat[0]), relTo(dir, flat[1])}}, nil
	}
	var out [][2]string
	for _, x := range list {
		p, err := clientPairs(x, dir)
		if err != nil {
			return nil, err
		}
		out = append(out, p...)
	}
	return out, nil
}

func relTo(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

// dockerCerts reads a host folder without hosts.toml the way Docker's
// certs.d is read: *.crt are CAs, X.cert with X.key a client pair.
func dockerCerts(out map[string]Host, name, dir string) error {
	files, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var h Host
	for _, f := range files {
		p := filepath.Join(dir, f.Name())
		switch filepath.Ext(f.Name()) {
		case ".crt":
			h.CAFiles = append(h.CAFiles, p)
		case ".cert":
			key := strings.TrimSuffix(p, ".cert") + ".key"
			if _, err := os.Stat(key); err != nil {
				return fmt.Errorf("%s: client certificate without its key: %w", p, err)
			}
			h.ClientCerts = append(h.ClientCerts, [2]string{p, key})
		}
	}
	out[name] = h
	return nil
}

func sameHost(a, b Host) bool {
	return a.PlainHTTP == b.PlainHTTP && a.SkipVerify == b.SkipVerify && a.PullOnly == b.PullOnly &&
		slices.Equal(a.CAFiles, b.CAFiles) && slices.Equal(a.ClientCerts, b.ClientCerts) && fmt.Sprint(a.Headers) == fmt.Sprint(b.Headers)
}

// MergeHosts lays berth's own tables over a hosts folder's: a host berth's
// config names is taken from it whole.
func MergeHosts(own, dir map[string]Host) map[string]Host {
	out := make(map[string]Host, len(own)+len(dir))
	for h, v := range dir {
		out[h] = v
	}
	for h, v := range own {
		out[h] = v
	}
	return out
}
