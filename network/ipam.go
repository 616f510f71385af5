package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/allocator"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cri/atomicfile"
)

// lease is one pod's claim on an address and its host ports, stored as
// <StateDir>/leases/<podID>. The files are the only record: they survive a
// restart of berthd, and Setup rebuilds the port rules from them.
type lease struct {
	Pod string     `json:"pod"`
	IP  netip.Addr `json:"ip"` // in the first subnet
	// AdditionalIPs are the pod's addresses in the other subnets (other
	// families), in their order.
	AdditionalIPs []netip.Addr  `json:"additionalIPs,omitempty"`
	MAC           macAddr       `json:"mac,omitempty"` // the pod's eth0's, the only source its port lets through; none in leases of older berthds
	Veth          string        `json:"veth"`
	Ports         []PortMapping `json:"ports,omitempty"`
}

// addrs are all the pod's addresses, its IP first.
func (l *lease) addrs() []netip.Addr {
	if !l.IP.IsValid() {
		return nil
	}
	return append([]netip.Addr{l.IP}, l.AdditionalIPs...)
}

// macAddr is a MAC address written as text ("02:70:0a:59:00:02").
type macAddr net.HardwareAddr

func (m macAddr) MarshalText() ([]byte, error) { return []byte(net.HardwareAddr(m).String()), nil }

func (m *macAddr) UnmarshalText(b []byte) error {
	mac, err := net.ParseMAC(string(b))
	*m = macAddr(mac)
	return err
}

var errNoLease = errors.New("no lease")

// leaseStore keeps the leases: host-local IPAM whose allocation is the CNI
// host-local plugin's allocator (round robin over each subnet, gateway
// skipped) and whose only record is berth's lease files, one per pod with
// all its addresses, replaced whole by a rename: a crash leaves a pod with
// every address or none, and no second record to drift. Changes hold an
// flock on <StateDir>/lock (other processes) and mu (other goroutines, and
// the race detector, which cannot see flock), and read every lease from
// disk, so there is no cache to go stale.
type leaseStore struct {
	stateDir string
	dir      string
	lock     string
	subnets  []netip.Prefix // a pod gets one address in each, the first one's is its IP

	mu sync.Mutex
}

func newLeaseStore(stateDir string, subnets []netip.Prefix) *leaseStore {
	return &leaseStore{
		stateDir: stateDir,
		dir:      filepath.Join(stateDir, "leases"),
		lock:     filepath.Join(stateDir, "lock"),
		subnets:  subnets,
	}
}

func (s *leaseStore) locked(f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	lf, err := os.OpenFile(s.lock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer lf.Close() // releases the flock
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("network: lock %s: %w", s.lock, err)
	}
	return f()
}

// reserve leases pod an address in each subnet, after checking that its
// host ports are free.
func (s *leaseStore) reserve(pod, veth string, ports []PortMapping) (*lease, error) {
	var l *lease
	err := s.locked(func() error {
		all, err := s.read()
		if err != nil {
			return err
		}
		if old, ok := all[pod]; ok {
			return fmt.Errorf("network: pod %s is already attached (%s); detach it first", pod, old.IP)
		}
		if err := portConflicts(ports, all); err != nil {
			return err
		}
		txn := &allocation{store: s, lease: &lease{Pod: pod, Veth: veth, Ports: ports}, used: usedAddrs(all), last: map[string]netip.Addr{}}
		for i, subnet := range s.subnets {
			if err := txn.allocate(i, subnet); err != nil {
				return fmt.Errorf("%w in %s (%d pods hold one)", err, subnet, len(all))
			}
		}
		l = txn.lease
		l.MAC = macAddr(derivedMAC(podMACKind, l.IP))
		// Where the round robin stopped first: failing that after the
		// lease is written would fail the Attach and leave the lease.
		if err := txn.saveLast(); err != nil {
			return err
		}
		return s.write(l)
	})
	return l, err
}

func usedAddrs(all map[string]*lease) map[netip.Addr]bool {
	used := make(map[netip.Addr]bool, len(all))
	for _, l := range all {
		for _, ip := range l.addrs() {
			used[ip] = true
		}
	}
	return used
}

// allocation is one reserve's view of the store for the host-local
// allocator (its backend.Store): the addresses in use when it began, and
// the lease it fills. It lives inside leaseStore.locked, so its Lock and
// Unlock, which the allocator calls, have nothing left to do, and it
// writes nothing until reserve has every address.
type allocation struct {
	store *leaseStore
	lease *lease
	used  map[netip.Addr]bool
	last  map[string]netip.Addr // by range ID, to save once the lease is written
	err   error                 // the store's own failure, told apart from exhaustion
}

var _ backend.Store = (*allocation)(nil)

// allocate gives the lease a free address of subnet, the rangeID-th one;
// an error that is not the store's own is ErrNoAddress.
func (a *allocation) allocate(rangeID int, subnet netip.Prefix) error {
	rs := allocator.RangeSet{{Subnet: types.IPNet(*prefixIPNet(subnet))}}
	if err := rs.Canonicalize(); err != nil {
		return err
	}
	_, err := allocator.NewIPAllocator(&rs, a, rangeID).Get(a.lease.Pod, podIfName, nil)
	if a.err != nil {
		return a.err
	}
	if err != nil {
		return ErrNoAddress
	}
	return nil
}

func (a *allocation) Lock() error   { return nil }
func (a *allocation) Unlock() error { return nil }
func (a *allocation) Close() error  { return nil }

// Reserve takes ip for the lease unless a pod holds it.
func (a *allocation) Reserve(_, _ string, ip net.IP, rangeID string) (bool, error) {
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		a.err = fmt.Errorf("network: allocator returned a bad address %v", ip)
		return false, a.err
	}
	addr = addr.Unmap()
	if a.used[addr] {
		return false, nil
	}
	a.used[addr] = true
	if !a.lease.IP.IsValid() {
		a.lease.IP = addr
	} else {
		a.lease.AdditionalIPs = append(a.lease.AdditionalIPs, addr)
	}
	a.last[rangeID] = addr
	return true, nil
}

// LastReservedIP is where the allocator's round robin resumes, so freed
// addresses are reused last, across restarts too.
func (a *allocation) LastReservedIP(rangeID string) (net.IP, error) {
	b, err := os.ReadFile(a.store.lastFile(rangeID))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	addr, err := netip.ParseAddr(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, nil // a torn write: start at the beginning of the range
	}
	return net.IP(addr.AsSlice()), nil
}

// GetByID returns what this reserve has taken so far: reserve has checked
// that the pod holds no other lease.
func (a *allocation) GetByID(_, _ string) []net.IP {
	var ips []net.IP
	for _, ip := range a.lease.addrs() {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return ips
}

// ReleaseByID is never called: a pod's addresses go with its lease file
// (leaseStore.release).
func (a *allocation) ReleaseByID(_, _ string) error {
	return errors.New("network: addresses are released with their lease")
}

// saveLast records where each range's round robin stopped. Like the
// leases, without fsync: losing it only restarts the round robin.
func (a *allocation) saveLast() error {
	for rangeID, ip := range a.last {
		if err := writeFileAtomic(a.store.lastFile(rangeID), []byte(ip.String()+"\n")); err != nil {
			return err
		}
	}
	return nil
}

func (s *leaseStore) lastFile(rangeID string) string {
	return filepath.Join(s.stateDir, "last-reserved-ip."+rangeID)
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func (s *leaseStore) release(pod string) error {
	return s.locked(func() error {
		err := os.Remove(filepath.Join(s.dir, pod))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("network: release lease: %w", err)
		}
		return nil
	})
}

// get reads one lease; a write is a rename, so no lock is needed.
func (s *leaseStore) get(pod string) (*lease, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, pod))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoLease
	}
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	var l lease
	if err := json.Unmarshal(b, &l); err != nil || l.Pod != pod || !l.IP.IsValid() {
		return nil, fmt.Errorf("network: bad lease file %s: %v", filepath.Join(s.dir, pod), err)
	}
	return &l, nil
}

// all returns every lease by pod ID.
func (s *leaseStore) all() (map[string]*lease, error) {
	var all map[string]*lease
	err := s.locked(func() (err error) {
		all, err = s.read()
		return err
	})
	return all, err
}

// read loads every lease; the caller holds the lock. A damaged file (only
// a power loss can truncate one, and that also ends every pod) is skipped:
// Reconcile removes it since its pod cannot be live.
func (s *leaseStore) read() (map[string]*lease, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	all := make(map[string]*lease, len(ents))
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue // a temp file of an interrupted write
		}
		l, err := s.get(name)
		if err != nil {
			l = &lease{Pod: name, Veth: vethName(name)}
		}
		all[name] = l
	}
	return all, nil
}

// write replaces the lease file atomically. No fsync: leases describe
// kernel state (links, rules) that a power loss does not keep either.
func (s *leaseStore) write(l *lease) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.dir, l.Pod), b)
}

// writeFileAtomic replaces path whole; its temp file is a dot file, which
// read skips.
func writeFileAtomic(path string, b []byte) error {
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("network: write %s: %w", path, err)
	}
	return nil
}
