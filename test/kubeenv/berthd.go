package kubeenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Berthd is a berthd of the run's own: root, state folder, socket, bridge
// and nftables table (other berthds, a node's or the integration tests',
// may run at the same time). No masquerade: every packet of a tier stays
// on this host.
type Berthd struct {
	*Proc  // the running berthd; Launch replaces it
	Root   string
	State  string
	Socket string
	Bridge string
	// CDIDir is berthd's only CDI spec folder: the run's own, where the
	// tiers' device plugin and DRA driver write the specs of their devices.
	CDIDir string
	args   []string
	config string // berthd.toml
	work   string
	// netns names the network namespace (/run/netns/NAME) berthd runs in,
	// "" for the host's: its bridge and tables live there.
	netns string
}

// NewBerthd writes berthd's configuration below w: its own bridge, subnet
// (none: the pod CIDR the kubelet passes on) and registryHost as a plain
// HTTP registry. binDir holds berthd, berth-shim, berth-shim-helper, berth-pause
// and berth-exec-init.
func NewBerthd(t *testing.T, w *Work, binDir, bridge, subnet, registryHost string) *Berthd {
	t.Helper()
	b := &Berthd{Root: w.Path("berth-root"), State: w.Path("berth-state"), Bridge: bridge, CDIDir: w.Path("cdi"), work: w.Dir}
	b.Socket = filepath.Join(b.State, "berth.sock")
	network := fmt.Sprintf("bridge = %q\nmasquerade = false\n", bridge)
	if subnet != "" {
		network += fmt.Sprintf("subnet = %q\n", subnet)
	}
	if err := os.MkdirAll(b.CDIDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("[network]\n%s\n[registry.%q]\nplain_http = true\n\n[cdi]\nspec_dirs = [%q]\n", network, registryHost, b.CDIDir)
	cfgPath := w.Path("berthd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	b.config = cfgPath
	b.args = []string{filepath.Join(binDir, "berthd"), "--config", cfgPath, "--root", b.Root,
		"--state", b.State, "--socket", b.Socket, "--log-level", "debug"}
	return b
}

// AddConfig adds TOML tables (toml) to berthd's configuration, for its
// next Launch.
func (b *Berthd) AddConfig(t *testing.T, toml string) {
	t.Helper()
	f, err := os.OpenFile(b.config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + toml); err != nil {
		t.Fatal(err)
	}
}

// InNamespaces makes Launch run berthd through enter (an nsenter into a
// node's mount and network namespaces, the latter named netns in
// /run/netns): its bridge, tables and mounts are that node's.
func (b *Berthd) InNamespaces(enter []string, netns string) {
	b.args = append(slices.Clone(enter), b.args...)
	b.netns = netns
}

// NetCommand is name with args run in berthd's network namespace.
func (b *Berthd) NetCommand(name string, args ...string) *exec.Cmd {
	if b.netns == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + b.netns, "--", name}, args...)...)
}

// MountInfo is the mount table berthd's mounts are in: its own, when it
// runs in a mount namespace of a node's.
func (b *Berthd) MountInfo() string {
	if b.netns != "" && b.Proc != nil && b.Running() {
		return fmt.Sprintf("/proc/%d/mountinfo", b.PID())
	}
	return "/proc/self/mountinfo"
}

// PodsFolder is state/pods, which berthd makes a private bind mount of
// itself at start ("" before NewBerthd).
func (b *Berthd) PodsFolder() string {
	if b == nil {
		return ""
	}
	return filepath.Join(b.State, "pods")
}

// Launch starts berthd (again, after a stop or a kill) and waits, 30 s at
// most, until its socket is there and ready holds: the tier's CRI client
// asks Version.
func (b *Berthd) Launch(t *testing.T, ready func() error) {
	t.Helper()
	b.Proc = Start(t, "berthd", filepath.Join(b.work, "berthd.log"), b.args...)
	b.WaitUp(t, 30*time.Second, func() error {
		conn, err := net.Dial("unix", b.Socket)
		if err != nil {
			return err
		}
		conn.Close()
		return ready()
	})
}

// Teardown stops berthd (the tier has removed its pods through the CRI
// first), then reports and kills processes still running from the run's
// folder (shims of pods berth failed to remove), and removes berth's
// bridge and nftables tables.
func (b *Berthd) Teardown(t *testing.T) {
	if b == nil || b.Proc == nil {
		return
	}
	if !b.Proc.Stop(syscall.SIGTERM, 20*time.Second) {
		t.Errorf("teardown: berthd did not stop within 20s of SIGTERM (killed)")
	}
	for _, pid := range LiveProcessesWithArg(b.work) {
		t.Errorf("teardown: process %d still runs from %s: %s (killed)", pid, b.work, Cmdline(pid))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if out, err := b.NetCommand("ip", "link", "del", b.Bridge).CombinedOutput(); err != nil && !bytes.Contains(out, []byte("Cannot find device")) {
		t.Errorf("teardown: ip link del %s: %v %s", b.Bridge, err, out)
	}
	for _, family := range []string{"ip", "netdev"} {
		if out, err := b.NetCommand("nft", "delete", "table", family, b.Bridge).CombinedOutput(); err != nil && !bytes.Contains(out, []byte("No such file")) {
			t.Errorf("teardown: nft delete table %s %s: %v %s", family, b.Bridge, err, out)
		}
	}
	if t.Failed() {
		t.Logf("berthd log (last 150 lines of %s):\n%s", b.Log, b.Tail(150))
	}
}

// Leftovers lists what berth still holds on the host of any pod: pod and
// container folders, IP leases, mounts below its folders (its own private
// bind mount of state/pods aside), veths on its bridge, and processes
// started with its state folder in their arguments (berthd aside, and
// the PIDs in others, such as the kubelet's, which names berth's socket).
func (b *Berthd) Leftovers(others ...int) []string {
	var left []string
	for _, dir := range []string{b.PodsFolder(), filepath.Join(b.Root, "containers"), filepath.Join(b.Root, "network", "leases")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			left = append(left, filepath.Join(dir, e.Name()))
		}
	}
	mountinfo := b.MountInfo()
	for _, m := range append(MountsUnderIn(mountinfo, b.Root), MountsUnderIn(mountinfo, b.State, b.PodsFolder())...) {
		left = append(left, "mount "+m)
	}
	for _, p := range b.Ports() {
		left = append(left, "veth "+p+" on "+b.Bridge)
	}
	for _, pid := range LiveProcessesWithArg(b.State) {
		if pid != b.PID() && !slices.Contains(others, pid) {
			left = append(left, fmt.Sprintf("process %d: %s", pid, Cmdline(pid)))
		}
	}
	return left
}

// Ports are the links on berth's bridge (its pods' veths), as its network
// namespace shows them.
func (b *Berthd) Ports() []string {
	out, _ := b.NetCommand("ip", "-o", "link", "show", "master", b.Bridge).Output()
	var ports []string
	for _, line := range strings.Split(string(out), "\n") {
		// "7: vethX@if2: <...> ..."
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			ports = append(ports, name)
		}
	}
	return ports
}
