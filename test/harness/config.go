package harness

import (
	"fmt"
	"sort"
	"strings"
)

// HostConfig is one [registry."HOST"] table of berthd's config file.
type HostConfig struct {
	Mirrors    []string
	PlainHTTP  bool
	CAFile     string
	SkipVerify bool
	Username   string
	Password   string
}

// RegistryTOML renders [registry."HOST"] tables, sorted by host.
func RegistryTOML(hosts map[string]HostConfig) string {
	names := make([]string, 0, len(hosts))
	for h := range hosts {
		names = append(names, h)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, h := range names {
		c := hosts[h]
		fmt.Fprintf(&b, "[registry.%q]\n", h)
		if len(c.Mirrors) > 0 {
			quoted := make([]string, len(c.Mirrors))
			for i, m := range c.Mirrors {
				quoted[i] = fmt.Sprintf("%q", m)
			}
			fmt.Fprintf(&b, "mirrors = [%s]\n", strings.Join(quoted, ", "))
		}
		if c.PlainHTTP {
			b.WriteString("plain_http = true\n")
		}
		if c.CAFile != "" {
			fmt.Fprintf(&b, "ca_file = %q\n", c.CAFile)
		}
		if c.SkipVerify {
			b.WriteString("skip_verify = true\n")
		}
		if c.Username != "" {
			fmt.Fprintf(&b, "username = %q\npassword = %q\n", c.Username, c.Password)
		}
	}
	return b.String()
}

// PlainHTTP is the config that lets berthd talk plain HTTP to the given hosts
// (the test registries' Host()).
func PlainHTTP(hosts ...string) string {
	m := map[string]HostConfig{}
	for _, h := range hosts {
		m[h] = HostConfig{PlainHTTP: true}
	}
	return RegistryTOML(m)
}

// ImageTOML is the [image] table with pull_progress_timeout set (a Go duration, "2s").
func ImageTOML(pullProgressTimeout string) string {
	return fmt.Sprintf("[image]\npull_progress_timeout = %q\n", pullProgressTimeout)
}
