package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/berth-runtime/berth/cri/errkind"
)

// Errors callers tell apart (wrapped, with the details).
var (
	ErrPortInUse = errkind.New(errkind.AlreadyExists, "network: host port in use")
	ErrNoAddress = errkind.New(errkind.ResourceExhausted, "network: no free address")
)

// Config describes the built-in bridge network. Start from DefaultConfig:
// the zero value of Masquerade is false.
type Config struct {
	Bridge     string // default "berth0"
	Subnet     string // IPv4 pod subnet, default "10.89.0.0/16"; the first host address is the gateway
	Subnet6    string // IPv6 pod subnet, none by default: pods get IPv6 only with one (or a pod CIDR with one)
	MTU        int    // default 1500
	Masquerade bool   // NAT egress from the pod subnet to anywhere else
	StateDir   string // lease files; required (e.g. /var/lib/berth/network)
	TableName  string // nftables table (family ip), default "berth"
	// SubnetFixed says the operator chose Subnet or Subnet6: the kubelet's
	// pod CIDR (SetPodCIDR) does not replace them.
	SubnetFixed bool
}

// DefaultConfig is the configuration berthd uses unless told otherwise.
func DefaultConfig() Config {
	return Config{
		Bridge:     "berth0",
		Subnet:     "10.89.0.0/16",
		MTU:        1500,
		Masquerade: true,
		StateDir:   "/var/lib/berth/network",
		TableName:  "berth",
	}
}

// PortMapping is a CRI port mapping. Only mappings with a HostPort need
// rules; the others are reachable on the pod IP anyway.
type PortMapping struct {
	Protocol      string `json:"protocol"` // tcp, udp or sctp (any case); empty means tcp
	ContainerPort int32  `json:"containerPort"`
	HostPort      int32  `json:"hostPort"`
	HostIP        string `json:"hostIP,omitempty"` // empty or 0.0.0.0: every node address
}

// Attachment is a pod's place on the network.
type Attachment struct {
	IP            net.IP        // the pod's address: its first IPv4 one when it has any (CNI), in the pod CIDR's first family (built-in)
	AdditionalIPs []net.IP      // any other addresses (CNI results may have several, IPv6; the built-in network's other family)
	Gateway       net.IP        // IP's gateway; nil when unknown
	HostVeth      string        // empty when unknown (CNI)
	Ports         []PortMapping // the host port mappings in effect, normalized
}

// Network is the built-in bridge network. Its methods are safe for
// concurrent use.
type Network struct {
	cfg     Config
	log     *slog.Logger
	subnets []netip.Prefix // one per family, the pod CIDR's order; each one's first host address is its gateway
	leases  *leaseStore

	// Setup and Reconcile rebuild the nftables maps from the lease files,
	// so they exclude Attach and Detach, which change both.
	mu sync.RWMutex

	stateMu  sync.Mutex
	ready    bool
	notReady string

	fixedLogged sync.Once // SetPodCIDR's conflict with a configured subnet
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// New validates cfg, filling in defaults for empty fields (except
// Masquerade). It changes nothing on the host: Setup does.
func New(cfg Config, log *slog.Logger) (*Network, error) {
	def := DefaultConfig()
	if cfg.Bridge == "" {
		cfg.Bridge = def.Bridge
	}
	if cfg.Subnet == "" {
		cfg.Subnet = def.Subnet
	}
	if cfg.MTU == 0 {
		cfg.MTU = def.MTU
	}
	if cfg.TableName == "" {
		cfg.TableName = def.TableName
	}
	if log == nil {
		log = slog.Default()
	}
	if len(cfg.Bridge) > 15 || !nameRE.MatchString(cfg.Bridge) {
		return nil, fmt.Errorf("network: bad bridge name %q (1-15 of A-Z a-z 0-9 _ . -)", cfg.Bridge)
	}
	if len(cfg.TableName) > 64 || !nameRE.MatchString(cfg.TableName) {
		return nil, fmt.Errorf("network: bad nftables table name %q", cfg.TableName)
	}
	if cfg.MTU < 576 || cfg.MTU > 65535 {
		return nil, fmt.Errorf("network: MTU %d out of range 576-65535", cfg.MTU)
	}
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("network: state dir %q must be an absolute path", cfg.StateDir)
	}
	subnets, err := configuredSubnets(cfg)
	if err != nil {
		return nil, err
	}
	if !cfg.SubnetFixed {
		saved, err := LoadPodCIDR(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		if saved != "" {
			if subnets, err = ParsePodCIDR(saved); err != nil {
				return nil, err
			}
		}
	}
	n := &Network{cfg: cfg, log: log, notReady: "network not set up yet"}
	n.useSubnets(subnets)
	return n, nil
}

// configuredSubnets are Subnet (IPv4) and Subnet6 (IPv6, if any).
func configuredSubnets(cfg Config) ([]netip.Prefix, error) {
	var subnets []netip.Prefix
	for _, c := range []struct {
		s, family string
		is4       bool
	}{{cfg.Subnet, "IPv4", true}, {cfg.Subnet6, "IPv6", false}} {
		if c.s == "" {
			continue
		}
		p, err := netip.ParsePrefix(c.s)
		if err == nil && p.Addr().Is4() != c.is4 {
			err = fmt.Errorf("not an %s network", c.family)
		}
		if err == nil {
			err = CheckSubnet(p)
		}
		if err != nil {
			return nil, fmt.Errorf("network: subnet %s: %w", c.s, err)
		}
		subnets = append(subnets, p)
	}
	return subnets, nil
}

// useSubnets makes subnets the ones pods get addresses from.
func (n *Network) useSubnets(subnets []netip.Prefix) {
	n.subnets = subnets
	n.leases = newLeaseStore(n.cfg.StateDir, subnets)
}

// gatewayOf is the gateway of a pod subnet, its first host address, which
// the bridge holds.
func gatewayOf(subnet netip.Prefix) netip.Addr { return subnet.Addr().Next() }

// SetPodCIDR makes the kubelet's pod CIDR the subnet of new pods, kept across
// restarts. A subnet set in the configuration wins (the conflict is logged
// once). The bridge has one gateway, so the subnet changes only while no pod
// holds an address: until then the answer is ErrSubnetInUse, running pods
// keep their addresses, and the kubelet sends the CIDR again at its next
// node status sync.
func (n *Network) SetPodCIDR(cidr string) error {
	p, err := ParsePodCIDR(cidr)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if slices.Equal(p, n.subnets) {
		return nil
	}
	if n.cfg.SubnetFixed {
		n.fixedLogged.Do(func() {
			n.log.Warn("the kubelet's pod CIDR is not used: network.subnet or subnet6 is set in the configuration",
				"podCIDR", cidr, "subnets", n.subnets)
		})
		return nil
	}
	all, err := n.leases.all()
	if err != nil {
		return err
	}
	if len(all) > 0 {
		return fmt.Errorf("%w: %d pods have addresses in %v; pod CIDR %s applies once they are gone",
			ErrSubnetInUse, len(all), n.subnets, cidr)
	}
	if err := SavePodCIDR(n.cfg.StateDir, cidr); err != nil {
		return err
	}
	n.log.Info("pod subnets set from the kubelet's pod CIDR", "subnets", p, "was", n.subnets)
	n.useSubnets(p)
	return n.setupLocked()
}

// Setup creates or repairs the bridge (with the pods' veths on it), enables
// the sysctls and (re)writes the nftables table, including the port
// mappings of every lease on file.
// It is idempotent; a failure leaves Ready false with the reason.
func (n *Network) Setup() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.setupLocked()
}

func (n *Network) setupLocked() error {
	err := n.setup()
	n.stateMu.Lock()
	n.ready, n.notReady = err == nil, ""
	if err != nil {
		n.notReady = err.Error()
	}
	n.stateMu.Unlock()
	return err
}

func (n *Network) setup() error {
	if err := n.checkKernelIPv6(); err != nil {
		return err
	}
	br, err := n.ensureBridge()
	if err != nil {
		return err
	}
	if err := n.setSysctls(); err != nil {
		return err
	}
	if err := n.configureBridge(br); err != nil {
		return err
	}
	all, err := n.leases.all()
	if err != nil {
		return err
	}
	if err := reattach(br, all); err != nil {
		return err
	}
	if err := n.writeTables(all); err != nil {
		return err
	}
	return n.writeGuard(all)
}

// Ready reports the NetworkReady condition, with the reason when false.
func (n *Network) Ready() (bool, string) {
	n.stateMu.Lock()
	defer n.stateMu.Unlock()
	return n.ready, n.notReady
}

func (n *Network) markBroken(err error) {
	n.stateMu.Lock()
	n.ready, n.notReady = false, err.Error()
	n.stateMu.Unlock()
}

// ensureSetup runs Setup unless it has succeeded, once for any number of
// callers waiting.
func (n *Network) ensureSetup() error {
	if ok, _ := n.Ready(); ok {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if ok, _ := n.Ready(); ok {
		return nil
	}
	return n.setupLocked()
}

// Attach gives the pod whose network namespace is pinned at netnsPath an
// address, an eth0 on the bridge and its host ports. On failure it undoes
// everything it did. Of pod, only the ID is used.
func (n *Network) Attach(ctx context.Context, pod PodInfo, netnsPath string, ports []PortMapping) (_ *Attachment, err error) {
	podID := pod.ID
	if err := checkPodID(podID); err != nil {
		return nil, err
	}
	if netnsPath == "" {
		return nil, errors.New("network: empty network namespace path")
	}
	ports, err = normalizePorts(ports)
	if err != nil {
		return nil, err
	}
	if err := n.ensureSetup(); err != nil {
		return nil, fmt.Errorf("network: not ready: %w", err)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if err := n.checkHostIPs(ports); err != nil {
		return nil, err
	}
	start := time.Now()

	l, err := n.leases.reserve(podID, vethName(podID), ports)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if uerr := n.teardown(l); uerr != nil {
				err = errors.Join(err, fmt.Errorf("network: undo: %w", uerr))
			}
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := n.addVeth(l, netnsPath); err != nil {
		return nil, err
	}
	n.log.Debug("pod attached", "pod", podID, "ip", l.IP, "veth", l.Veth, "ports", len(l.Ports), "took", time.Since(start))
	return n.attachment(l), nil
}

// checkHostIPs refuses a host port on an address of a family the pods do
// not have: it would have no rule.
func (n *Network) checkHostIPs(ports []PortMapping) error {
	for _, p := range ports {
		if p.HostIP == "" {
			continue
		}
		ip := netip.MustParseAddr(p.HostIP) // normalizePorts checked it
		if ip.Is6() && ip.IsLoopback() {
			// IPv6 has no route_localnet: [::1] cannot be forwarded to a pod.
			return errkind.Errorf(errkind.Invalid, "network: port_mappings host_ip %s (host_port %d): IPv6 loopback cannot reach a pod; use 127.0.0.1 or a node address",
				p.HostIP, p.HostPort)
		}
		if _, ok := n.subnetOf4or6(ip.Is4()); !ok {
			return errkind.Errorf(errkind.FailedPrecondition, "network: port_mappings host_ip %s (host_port %d): pods on this node have no address of its family (pod subnets %v)",
				p.HostIP, p.HostPort, n.subnets)
		}
	}
	return nil
}

// Detach undoes Attach. It is idempotent and needs neither the namespace
// (netnsPath is not used) nor the lease file: without them it still
// removes the host veth.
func (n *Network) Detach(ctx context.Context, pod PodInfo, netnsPath string) error {
	podID := pod.ID
	if err := checkPodID(podID); err != nil {
		return err
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	l, err := n.leases.get(podID)
	if errors.Is(err, errNoLease) {
		return delVeth(vethName(podID))
	}
	if err != nil {
		return err
	}
	return n.teardown(l)
}

// teardown removes the pod's host ports, guard chain and veth, then its
// lease, so that a failure keeps the lease for a retry to find. It is
// slower than Attach: nftables commits and, far longer, a link's
// unregistering wait for RCU grace periods. The rules and the veth go side
// by side, since neither needs the other gone first.
func (n *Network) teardown(l *lease) error {
	veth := make(chan error, 1)
	go func() { veth <- delVeth(l.Veth) }()
	if err := errors.Join(n.delElements(l), n.delGuard(l), <-veth); err != nil {
		return err
	}
	return n.leases.release(l.Pod)
}

// Reconcile keeps the network of the pods in livePods and removes every
// other pod's lease, host veth and port mappings, then rewrites the
// port maps from the remaining leases.
func (n *Network) Reconcile(ctx context.Context, livePods map[string]bool) (err error) {
	if err := n.ensureSetup(); err != nil {
		return fmt.Errorf("network: not ready: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	defer func() {
		if err != nil { // not ready until a setup (retried at the next pod) succeeds
			n.markBroken(fmt.Errorf("network: reconcile at start: %w", err))
		}
	}()
	all, err := n.leases.all()
	if err != nil {
		return err
	}
	live := map[string]*lease{}
	var dead []*lease
	for pod, l := range all {
		if livePods[pod] {
			live[pod] = l
		} else {
			dead = append(dead, l)
		}
	}
	// One transaction each replaces the maps and the guard, which also
	// drops what belonged to a lease that was lost.
	if err := n.rewritePorts(live); err != nil {
		return err
	}
	if err := n.writeGuard(live); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, l := range live {
		keep[l.Veth] = true
	}
	var errs []error
	for _, l := range dead {
		if err := delVeth(l.Veth); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := n.leases.release(l.Pod); err != nil {
			errs = append(errs, err)
			continue
		}
		n.log.Info("released network of a pod that is gone", "pod", l.Pod, "ip", l.IP)
	}
	// Veths on the bridge with no live lease, e.g. after the state dir
	// was lost.
	stray, err := n.bridgeVeths()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range stray {
		if keep[name] {
			continue
		}
		if err := delVeth(name); err != nil {
			errs = append(errs, err)
		} else {
			n.log.Info("removed a host veth without a live pod", "veth", name)
		}
	}
	return errors.Join(errs...)
}

// Lookup returns the pod's attachment as recorded in its lease file.
func (n *Network) Lookup(podID string) (*Attachment, bool) {
	if checkPodID(podID) != nil {
		return nil, false
	}
	n.mu.RLock() // the gateway changes with SetPodCIDR
	defer n.mu.RUnlock()
	l, err := n.leases.get(podID)
	if err != nil {
		if !errors.Is(err, errNoLease) {
			n.log.Warn("reading lease", "pod", podID, "err", err)
		}
		return nil, false
	}
	return n.attachment(l), true
}

func (n *Network) attachment(l *lease) *Attachment {
	a := &Attachment{
		IP:       net.IP(l.IP.AsSlice()),
		HostVeth: l.Veth,
		Ports:    append([]PortMapping(nil), l.Ports...),
	}
	for _, ip := range l.AdditionalIPs {
		a.AdditionalIPs = append(a.AdditionalIPs, net.IP(ip.AsSlice()))
	}
	if subnet, ok := n.subnetOf(l.IP); ok {
		a.Gateway = net.IP(gatewayOf(subnet).AsSlice())
	}
	return a
}

// subnetOf is the pod subnet that holds ip.
func (n *Network) subnetOf(ip netip.Addr) (netip.Prefix, bool) {
	for _, s := range n.subnets {
		if s.Contains(ip) {
			return s, true
		}
	}
	return netip.Prefix{}, false
}

// checkPodID keeps pod IDs usable as file names.
func checkPodID(id string) error {
	if id == "" || len(id) > 200 || !nameRE.MatchString(id) || id[0] == '.' {
		return fmt.Errorf("network: bad pod ID %q", id)
	}
	return nil
}
