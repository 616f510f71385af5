package cni

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sync/errgroup"

	"github.com/berth-runtime/berth/network"
)

// Config says where the CNI network configuration, the plugins and berth's
// records are.
type Config struct {
	ConfDir  string   // network configurations; default /etc/cni/net.d
	BinDirs  []string // plugin binaries, searched in order; default /opt/cni/bin
	CacheDir string   // libcni's cache (results); required
	StateDir string   // one record per attached pod; required, persistent; its parent keeps the pod CIDR
	IfName   string   // the pod's interface; default eth0
}

// undoTimeout bounds the DEL that undoes a failed ADD, which runs even when
// the caller has given up.
const undoTimeout = 2 * time.Minute

// Network attaches pods with the CNI plugins of the first network
// configuration in ConfDir. It has no background work: Ready and Attach
// read the folder again (a few stats and a small file, far cheaper than
// the plugins), so a configuration that appears, changes or breaks is
// seen at the next call without a restart or a watch.
type Network struct {
	cfg Config
	log *slog.Logger
	cni *libcni.CNIConfig

	// Reconcile excludes Attach and Detach.
	mu sync.RWMutex

	stateMu sync.Mutex
	last    string // the last configuration (file and bytes) or error, to log changes once

	cidrMu  sync.Mutex
	podCIDR []string // the kubelet's, one range per address family; nil until it sent one
}

var _ network.PodNetwork = (*Network)(nil)

// New checks cfg and fills in defaults. It reads no configuration yet.
func New(cfg Config, log *slog.Logger) (*Network, error) {
	if cfg.ConfDir == "" {
		cfg.ConfDir = "/etc/cni/net.d"
	}
	if len(cfg.BinDirs) == 0 {
		cfg.BinDirs = []string{"/opt/cni/bin"}
	}
	if cfg.IfName == "" {
		cfg.IfName = "eth0"
	}
	if log == nil {
		log = slog.Default()
	}
	for _, d := range append([]string{cfg.ConfDir, cfg.CacheDir, cfg.StateDir}, cfg.BinDirs...) {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("cni: %q is not an absolute path", d)
		}
	}
	exec := &invoke.DefaultExec{
		RawExec:       &invoke.RawExec{Stderr: logWriter{log}},
		PluginDecoder: version.PluginDecoder{},
	}
	n := &Network{
		cfg: cfg,
		log: log,
		cni: libcni.NewCNIConfigWithCacheDir(cfg.BinDirs, cfg.CacheDir, exec),
	}
	saved, err := network.LoadPodCIDR(n.podCIDRDir())
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	if saved != "" {
		n.podCIDR = strings.Split(saved, ",")
	}
	return n, nil
}

func (n *Network) podCIDRDir() string { return filepath.Dir(n.cfg.StateDir) }

// SetPodCIDR passes the kubelet's pod CIDR on to the plugins of pods
// attached from now on, as the ipRanges capability (host-local allocates
// from it where its configuration declares the capability), and keeps it
// across restarts: the kubelet sends it again only when it changes.
func (n *Network) SetPodCIDR(cidr string) error {
	var ranges []string
	for _, part := range strings.Split(cidr, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil || p != p.Masked() {
			return fmt.Errorf("%w %q: %s is not a network address", network.ErrBadPodCIDR, cidr, part)
		}
		ranges = append(ranges, p.String())
	}
	n.cidrMu.Lock()
	defer n.cidrMu.Unlock()
	if slices.Equal(ranges, n.podCIDR) {
		return nil
	}
	if err := network.SavePodCIDR(n.podCIDRDir(), strings.Join(ranges, ",")); err != nil {
		return err
	}
	n.log.Info("pod CIDR from the kubelet passed to CNI plugins as ipRanges", "podCIDR", ranges)
	n.podCIDR = ranges
	return nil
}

func (n *Network) currentPodCIDR() []string {
	n.cidrMu.Lock()
	defer n.cidrMu.Unlock()
	return n.podCIDR
}

// logWriter logs what plugins print on stderr (after a success; after a
// failure it is in the error).
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Debug("cni plugin stderr", "text", strings.TrimSpace(string(p)))
	return len(p), nil
}

// conf loads the current configuration, logging when it changed.
func (n *Network) conf() (*netConf, error) {
	c, err := loadConf(n.cfg.ConfDir, n.cfg.BinDirs)
	state := ""
	if err != nil {
		state = "error: " + err.Error()
	} else {
		state = c.file + "\x00" + string(c.list.Bytes)
	}
	n.stateMu.Lock()
	changed := state != n.last
	n.last = state
	n.stateMu.Unlock()
	if changed {
		if err != nil {
			n.log.Warn("no usable CNI network configuration: pod network not ready", "err", err)
		} else {
			n.log.Info("CNI network configuration loaded", "file", c.file, "network", c.list.Name,
				"cniVersion", c.list.CNIVersion, "plugins", pluginTypes(c.list))
		}
	}
	return c, err
}

func pluginTypes(list *libcni.NetworkConfigList) string {
	var t []string
	for _, p := range list.Plugins {
		t = append(t, p.Network.Type)
	}
	return strings.Join(t, ",")
}

// Ready is true when the first configuration in the folder is valid and
// its plugins are installed.
func (n *Network) Ready() (bool, string) {
	if _, err := n.conf(); err != nil {
		return false, "cni: " + err.Error()
	}
	return true, ""
}

// Attach runs ADD for the pod with the current configuration. The record
// DEL needs is written first; a failed ADD is undone with DEL.
func (n *Network) Attach(ctx context.Context, pod network.PodInfo, netnsPath string, ports []network.PortMapping) (_ *network.Attachment, err error) {
	if err := checkPodID(pod.ID); err != nil {
		return nil, err
	}
	if netnsPath == "" {
		return nil, errors.New("cni: empty network namespace path")
	}
	args, err := cniArgs(pod)
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	pms, err := portMappings(ports)
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	caps, err := capabilityArgs(pod.Annotations, pms, n.currentPodCIDR())
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	c, err := n.conf()
	if err != nil {
		return nil, fmt.Errorf("cni: not ready: %w", err)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	start := time.Now()

	rec := &record{File: c.file, Network: c.list.Name, Config: c.list.Bytes, IfName: n.cfg.IfName,
		NetNS: netnsPath, Args: args, Caps: caps}
	if err := n.writeRecord(pod.ID, rec); err != nil {
		return nil, err
	}
	rt := rec.runtimeConf(pod.ID, netnsPath)
	defer func() {
		if err == nil {
			return
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		if uerr := n.del(uctx, pod.ID, rec, rt); uerr != nil {
			err = errors.Join(err, fmt.Errorf("cni: undo with DEL: %w", uerr))
		}
	}()
	res, err := n.cni.AddNetworkList(ctx, c.list, rt)
	if err != nil {
		return nil, fmt.Errorf("cni: network %q (%s): ADD: %w", c.list.Name, c.file, err)
	}
	att, err := attachment(res)
	if err != nil {
		return nil, fmt.Errorf("cni: network %q (%s): ADD result: %w", c.list.Name, c.file, err)
	}
	for _, p := range pms {
		att.Ports = append(att.Ports, network.PortMapping{Protocol: p.Protocol, ContainerPort: p.ContainerPort,
			HostPort: p.HostPort, HostIP: p.HostIP})
	}
	n.log.Debug("pod attached", "pod", pod.ID, "network", c.list.Name, "ip", att.IP, "additional", att.AdditionalIPs,
		"ports", len(att.Ports), "took", time.Since(start))
	return att, nil
}

// runtimeConf is the libcni call for the pod; netns "" when the namespace
// is gone (DEL only).
func (r *record) runtimeConf(pod, netns string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: pod, NetNS: netns, IfName: r.IfName, Args: r.Args, CapabilityArgs: r.Caps}
}

// attachment reads the pod's addresses from an ADD result: the first IPv4
// address is the pod IP (the first address when there is no IPv4 one), the
// others are additional. Addresses of host-side interfaces are skipped.
func attachment(res types.Result) (*network.Attachment, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, err
	}
	var ips []*current.IPConfig
	for _, ipc := range r.IPs {
		if ipc.Interface != nil && *ipc.Interface >= 0 && *ipc.Interface < len(r.Interfaces) &&
			r.Interfaces[*ipc.Interface].Sandbox == "" {
			continue
		}
		ips = append(ips, ipc)
	}
	if len(ips) == 0 {
		return nil, errors.New("no IP address for the pod")
	}
	primary := 0
	for i, ipc := range ips {
		if ipc.Address.IP.To4() != nil {
			primary = i
			break
		}
	}
	att := &network.Attachment{IP: normalize(ips[primary].Address.IP), Gateway: normalize(ips[primary].Gateway)}
	for i, ipc := range ips {
		if i != primary {
			att.AdditionalIPs = append(att.AdditionalIPs, normalize(ipc.Address.IP))
		}
	}
	return att, nil
}

func normalize(ip net.IP) net.IP {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip
}

// Detach runs DEL with what ADD was given, from the pod's record; a pod
// without one has nothing attached. When the namespace is gone (a reboot,
// or its pin was released) DEL runs without one, so that plugins still
// release addresses and rules.
func (n *Network) Detach(ctx context.Context, pod network.PodInfo, netnsPath string) error {
	if err := checkPodID(pod.ID); err != nil {
		return err
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.detach(ctx, pod.ID, netnsPath)
}

func (n *Network) detach(ctx context.Context, pod, netnsPath string) error {
	rec, err := n.readRecord(pod)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	netns := ""
	for _, p := range []string{netnsPath, rec.NetNS} {
		if isNetNS(p) {
			netns = p
			break
		}
	}
	return n.del(ctx, pod, rec, rec.runtimeConf(pod, netns))
}

// del runs DEL (libcni adds the cached ADD result as prevResult) and, once
// it succeeded, forgets the record.
func (n *Network) del(ctx context.Context, pod string, rec *record, rt *libcni.RuntimeConf) error {
	list, err := parseBytes(rec.Config)
	if err != nil {
		return fmt.Errorf("cni: pod record %s: %w", n.recordPath(pod), err)
	}
	if err := n.cni.DelNetworkList(ctx, list, rt); err != nil {
		return fmt.Errorf("cni: network %q (%s): DEL: %w", rec.Network, rec.File, err)
	}
	n.log.Debug("pod detached", "pod", pod, "network", rec.Network, "netns", rt.NetNS)
	return n.removeRecord(pod)
}

// Reconcile runs DEL for every recorded pod not in live (stopped, removed
// or gone with a reboot) and CHECK for the others, logging what fails: a
// plugin that fails DEL must not keep berthd from starting, and the record
// stays for StopPodSandbox to try again.
func (n *Network) Reconcile(ctx context.Context, live map[string]bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	pods, err := n.recordedPods()
	if err != nil {
		return fmt.Errorf("cni: %w", err)
	}
	// Pods are independent: a few at a time, so that a node with many
	// pods is not kept from serving for long.
	var g errgroup.Group
	g.SetLimit(reconcileParallel)
	for _, pod := range pods {
		g.Go(func() error {
			if live[pod] {
				n.check(ctx, pod)
				return nil
			}
			if err := n.detach(ctx, pod, ""); err != nil {
				n.log.Warn("releasing the network of a pod that is gone", "pod", pod, "err", err)
				return nil
			}
			n.log.Info("released the network of a pod that is gone", "pod", pod)
			return nil
		})
	}
	return g.Wait()
}

// reconcileParallel is how many pods Reconcile handles at once.
const reconcileParallel = 8

// check runs CHECK for a live pod and logs the outcome.
func (n *Network) check(ctx context.Context, pod string) {
	rec, err := n.readRecord(pod)
	if err != nil {
		n.log.Warn("pod network record", "pod", pod, "err", err)
		return
	}
	list, err := parseBytes(rec.Config)
	if err != nil {
		n.log.Warn("pod network record", "pod", pod, "err", err)
		return
	}
	rt := rec.runtimeConf(pod, rec.NetNS)
	if gte, _ := version.GreaterThanOrEqualTo(list.CNIVersion, "0.4.0"); !gte || list.DisableCheck {
		return
	}
	if res, err := n.cni.GetNetworkListCachedResult(list, rt); err != nil || res == nil {
		n.log.Warn("no cached CNI result for a running pod: not checked", "pod", pod, "network", rec.Network, "err", err)
		return
	}
	if err := n.cni.CheckNetworkList(ctx, list, rt); err != nil {
		n.log.Warn("CNI CHECK failed for a running pod", "pod", pod, "network", rec.Network, "err", err)
		return
	}
	n.log.Debug("CNI CHECK passed", "pod", pod, "network", rec.Network)
}

var podIDRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// checkPodID keeps pod IDs usable as file names and CNI container IDs.
func checkPodID(id string) error {
	if id == "" || len(id) > 200 || !podIDRE.MatchString(id) || id[0] == '.' {
		return fmt.Errorf("cni: bad pod ID %q", id)
	}
	return nil
}
