package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berth-runtime/berth/test/harness"
)

// sample is what berthd and its shims hold at one point of the soak.
type sample struct {
	cycles int // pod cycles done when it was taken

	berthdRSS, shimRSS              float64 // MiB; shimRSS: the resident pod's shim
	goroutines, berthdFDs           int
	shimFDs, shimPidFDs             int // the resident shim's open files: pidfds apart, the rest
	shims, mounts, cgroups, veths   int
	nftElements, nftRules, leases   int
	snapshots, logFiles, stateFiles int
	// Of the shims of the cycles since the sample before (the warm-up's for
	// the baseline), none in the sample after the churn:
	churnShimRSS float64 // MiB, their mean
	churnShimFDs int     // the most open files any of them held
	errors       []string
}

// figure is one column of the samples: how it is read, and what the soak
// asks of it.
type figure struct {
	name string
	key  string // its name in the sample lines
	get  func(sample) float64
	// returns: after the churn it must come back to its baseline (or below).
	returns bool
	// growth, when set, bounds how it may grow over the rounds.
	growth *growthBound
}

// growthBound bounds a figure's growth: its slope over the rounds' samples
// (Theil-Sen, the median of the slopes between every two samples, which one
// round's swing of a Go heap does not move as it moves a least-squares
// fit), per 1,000 cycles. A figure fails when it grows more than perKilo
// AND more than floor over the whole run: a short run cannot tell growth
// below floor from noise.
type growthBound struct {
	perKilo, floor float64
	why            string
}

// figures lists the figures the soak prints and checks, in print order.
var figures = []figure{
	{name: "berthd RSS (MiB)", key: "berthd_rss_mib", get: func(s sample) float64 { return s.berthdRSS },
		growth: &growthBound{16, 8, "16 KiB per pod cycle with its 10 ExecSync calls and half a stream; " +
			"berthd's RSS swings by several MiB between collections"}},
	{name: "berthd goroutines", key: "goroutines", get: func(s sample) float64 { return float64(s.goroutines) }, returns: true},
	{name: "berthd fds", key: "berthd_fds", get: func(s sample) float64 { return float64(s.berthdFDs) }, returns: true},
	{name: "resident shim RSS (MiB)", key: "shim_rss_mib", get: func(s sample) float64 { return s.shimRSS },
		growth: &growthBound{4, 2, "400 bytes per exec (10 ExecSync and half a stream per cycle): " +
			"a per-exec leak like containerd/ttrpc#241 is larger"}},
	{name: "resident shim fds (no pidfds)", key: "shim_fds", get: func(s sample) float64 { return float64(s.shimFDs) }, returns: true},
	{name: "resident shim pidfds", key: "shim_pidfds", get: func(s sample) float64 { return float64(s.shimPidFDs) },
		growth: &growthBound{10, 64, "libcontainer keeps a pidfd per exec'd process that only the shim's garbage " +
			"collector closes, so their count swings; one kept per exec would be 10,000 per 1,000 cycles"}},
	{name: "cycle shim RSS (MiB, mean)", key: "cycle_shim_rss_mib", get: func(s sample) float64 { return s.churnShimRSS },
		growth: &growthBound{2, 1, "a new shim is as big as the first: more would be state it inherits from berthd"}},
	{name: "cycle shim fds (most)", key: "cycle_shim_fds", get: func(s sample) float64 { return float64(s.churnShimFDs) },
		growth: &growthBound{1, 1, "a new shim holds as many files as the first: more would be fds berthd leaks into its children"}},
	{name: "shims", key: "shims", get: func(s sample) float64 { return float64(s.shims) }, returns: true},
	{name: "mounts", key: "mounts", get: func(s sample) float64 { return float64(s.mounts) }, returns: true},
	{name: "cgroups", key: "cgroups", get: func(s sample) float64 { return float64(s.cgroups) }, returns: true},
	{name: "veths", key: "veths", get: func(s sample) float64 { return float64(s.veths) }, returns: true},
	{name: "nft elements", key: "nft_elements", get: func(s sample) float64 { return float64(s.nftElements) }, returns: true},
	{name: "nft rules", key: "nft_rules", get: func(s sample) float64 { return float64(s.nftRules) }, returns: true},
	{name: "IP leases", key: "leases", get: func(s sample) float64 { return float64(s.leases) }, returns: true},
	{name: "snapshots", key: "snapshots", get: func(s sample) float64 { return float64(s.snapshots) }, returns: true},
	{name: "log files", key: "log_files", get: func(s sample) float64 { return float64(s.logFiles) }, returns: true},
	{name: "state files", key: "state_files", get: func(s sample) float64 { return float64(s.stateFiles) }, returns: true},
}

// take samples berthd, its shims and what they hold on the host. A figure
// it could not read is noted in errors (and fails the soak).
func (e *soakEnv) take(cycles int, r resident) sample {
	s := sample{cycles: cycles}
	fail := func(what string, err error) { s.errors = append(s.errors, fmt.Sprintf("%s: %v", what, err)) }
	pid := e.d.PID()
	rss, err := harness.ProcessRSS(pid)
	if err != nil {
		fail("berthd RSS", err)
	}
	s.berthdRSS = mib(rss)
	if s.berthdFDs, err = harness.OpenFDs(pid); err != nil {
		fail("berthd fds", err)
	}
	if m, err := harness.ScrapeMetrics(e.d.MetricsAddr()); err != nil {
		fail("berthd metrics", err)
	} else {
		s.goroutines = int(m["go_goroutines"])
	}

	residentShim := e.shimPID(r.pod)
	shims := e.d.ShimPIDs()
	s.shims = len(shims)
	for _, p := range shims {
		rss, err := harness.ProcessRSS(p)
		if err != nil {
			continue // exited since it was listed
		}
		if p == residentShim {
			s.shimRSS = mib(rss)
			fds, err := harness.OpenFDs(p)
			if err != nil {
				fail("resident shim fds", err)
			}
			s.shimPidFDs = harness.OpenPidFDs(p)
			s.shimFDs = fds - s.shimPidFDs
		}
	}
	if s.shimRSS == 0 {
		fail("resident shim", fmt.Errorf("shim %d of pod %s is not running", residentShim, r.pod))
	}

	mounts, err := harness.MountPointsUnder(e.d.Root, e.d.State)
	if err != nil {
		fail("mounts", err)
	}
	s.mounts = len(mounts)
	s.cgroups = len(harness.CgroupDirsUnder(e.parent))
	bridge := e.d.Bridge()
	if s.veths, err = harness.BridgePorts(bridge); err != nil {
		fail("veths", err)
	}
	if s.nftElements, s.nftRules, err = harness.NftablesObjects(bridge); err != nil {
		fail("nftables", err)
	}
	s.leases = harness.FilesUnder(filepath.Join(e.d.Root, "network", "leases"))
	snaps, _ := os.ReadDir(filepath.Join(e.d.Root, harness.SnapshotsDir)) // none before the first pull
	s.snapshots = len(snaps)
	s.logFiles = harness.FilesUnder(e.logs)
	// What berth keeps per pod and container besides the above: records,
	// sockets' folders, writable layers, pins. The content store and the
	// snapshots are the images', counted apart.
	s.stateFiles = harness.FilesUnder(e.d.State) + harness.FilesUnder(e.d.Root, "content", "snapshots")
	return s
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// slopePerKilo is the Theil-Sen slope of f over the samples (the median
// of the slopes between every two of them), per 1,000 cycles.
func slopePerKilo(samples []sample, f func(sample) float64) float64 {
	var slopes []float64
	for i, a := range samples {
		for _, b := range samples[i+1:] {
			if b.cycles != a.cycles {
				slopes = append(slopes, (f(b)-f(a))/float64(b.cycles-a.cycles)*1000)
			}
		}
	}
	if len(slopes) == 0 {
		return 0
	}
	slices.Sort(slopes)
	if n := len(slopes); n%2 == 0 {
		return (slopes[n/2-1] + slopes[n/2]) / 2
	}
	return slopes[len(slopes)/2]
}

// sampleLine is one sample as a line of the soak's output.
func sampleLine(label string, s sample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak sample %-9s cycles=%d", label, s.cycles)
	for _, f := range figures {
		fmt.Fprintf(&b, " %s=%s", f.key, num(f.get(s)))
	}
	return b.String()
}

// num prints a count as an integer, a size with one decimal.
func num(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}
