package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// What a berthd holds on the host, counted for leak and soak checks. None
// of these take a testing.TB: the soak test samples them from its own loop
// and reports a failed read as a figure it could not take.

// MountPoints lists the mount points of this mount namespace.
func MountPoints() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// MountPointsUnder lists the mount points of this mount namespace that lie
// below one of dirs (the daemon's root and state folders).
func MountPointsUnder(dirs ...string) ([]string, error) {
	all, err := MountPoints()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range all {
		for _, d := range dirs {
			if strings.HasPrefix(m, d+"/") {
				out = append(out, m)
				break
			}
		}
	}
	return out, nil
}

// CgroupDirs lists the folders of cgroup rel (a glob pattern, relative to
// the hierarchies' roots) that exist: one per cgroup v1 hierarchy, or the
// one of the v2 tree.
func CgroupDirs(rel string) []string {
	rel = strings.Trim(rel, "/")
	v1, _ := filepath.Glob("/sys/fs/cgroup/*/" + rel) // fails only on a bad pattern
	v2, _ := filepath.Glob("/sys/fs/cgroup/" + rel)
	return append(v1, v2...)
}

// CgroupDirsUnder lists the cgroup folders below parent ("berth-soak/x"),
// parent excluded, in every hierarchy: one set on cgroup v2, one per
// controller on v1.
func CgroupDirsUnder(parent string) []string {
	var out []string
	for _, root := range CgroupDirs(parent) {
		// A cgroup removed during the walk is not an error: it is gone.
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && p != root {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// BridgePorts counts the links attached to bridge (0 when it does not
// exist). A dump that another test's link changes interrupted is repeated.
func BridgePorts(bridge string) (int, error) {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return 0, nil
	}
	links, err := netlink.LinkList()
	for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 10; i++ {
		links, err = netlink.LinkList()
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			n++
		}
	}
	return n, nil
}

// NftablesObjects counts the set (and map) elements and the rules of the
// nftables tables called table, in every family: berthd names its tables
// after its bridge.
func NftablesObjects(table string) (elements, rules int, err error) {
	c, err := nftables.New()
	if err != nil {
		return 0, 0, err
	}
	tables, err := c.ListTables()
	if err != nil {
		return 0, 0, err
	}
	for _, t := range tables {
		if t.Name != table {
			continue
		}
		sets, err := c.GetSets(t)
		if err != nil {
			return 0, 0, fmt.Errorf("sets of %s: %w", t.Name, err)
		}
		for _, s := range sets {
			els, err := c.GetSetElements(s)
			if err != nil {
				return 0, 0, fmt.Errorf("elements of %s %s: %w", t.Name, s.Name, err)
			}
			elements += len(els)
		}
		chains, err := c.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return 0, 0, err
		}
		for _, ch := range chains {
			if ch.Table.Name != table {
				continue
			}
			rs, err := c.GetRules(t, ch)
			if err != nil {
				return 0, 0, fmt.Errorf("rules of %s %s: %w", t.Name, ch.Name, err)
			}
			rules += len(rs)
		}
	}
	return elements, rules, nil
}

// FilesUnder counts the regular files below dir, skipping the folders
// (relative to dir) in skip; a folder that does not exist holds none.
func FilesUnder(dir string, skip ...string) int {
	n := 0
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return nil // removed meanwhile
		case d.IsDir():
			for _, s := range skip {
				if p == filepath.Join(dir, s) {
					return filepath.SkipDir
				}
			}
		case d.Type().IsRegular():
			n++
		}
		return nil
	})
	return n
}

// ProcessRSS is a process's resident set (VmRSS) in bytes.
func ProcessRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for process %d", pid)
}

// OpenFDs counts a process's open files.
func OpenFDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

// ShimPIDs lists the live berth-shim processes of this daemon: those
// serving a pod folder under its state folder. A berth-shim-helper that
// serves a shim's execs for a moment names the pod folder too, and is not
// one.
func (d *Daemon) ShimPIDs() []int {
	var shims []int
	for _, pid := range LiveProcessesWithArg(filepath.Join(d.State, "pods") + "/") {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]) == "berth-shim" {
			shims = append(shims, pid)
		}
	}
	return shims
}

// Bridge is the bridge of the pod network the harness gave this daemon
// (its nftables tables carry the same name), "" when its config names none.
func (d *Daemon) Bridge() string {
	b, err := os.ReadFile(d.Config)
	if err != nil {
		return ""
	}
	m := regexp.MustCompile(`(?m)^bridge = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// MetricsAddr is where berthd serves /metrics (its [metrics] address, as
// its last start logged it), "" when it serves none.
func (d *Daemon) MetricsAddr() string {
	m := regexp.MustCompile(`metrics=(\S+:\d+)`).FindAllStringSubmatch(d.Logs(), -1)
	if m == nil {
		return ""
	}
	return m[len(m)-1][1]
}

// metricsClient opens a connection per scrape and closes it after: a kept
// connection would be one more fd and goroutine in the berthd it measures.
var metricsClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// ScrapeMetrics reads a Prometheus text endpoint (addr "host:port"): each
// series as printed, name and labels, to its value.
func ScrapeMetrics(addr string) (map[string]float64, error) {
	resp, err := metricsClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// RemoveCgroupTree removes parent and the cgroups below it, children
// first, in every hierarchy; one that still holds a process stays.
func RemoveCgroupTree(parent string) {
	dirs := CgroupDirsUnder(parent)
	for i := len(dirs) - 1; i >= 0; i-- {
		os.Remove(dirs[i])
	}
	for _, r := range CgroupDirs(parent) {
		os.Remove(r)
	}
}

// OpenPidFDs counts the pidfds among a process's open files (0 when it
// cannot tell).
func OpenPidFDs(pid int) int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == "anon_inode:[pidfd]" {
			n++
		}
	}
	return n
}
