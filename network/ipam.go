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

	"golang.org/x/sys/unix"
)

// lease is one pod's claim on an address and its host ports, stored as
// <StateDir>/leases/<podID>. The files are the only record: they survive a
// restart of berthd, and Setup rebuilds the port rules from them.
type lease struct {
	Pod   string        `json:"pod"`
	IP    netip.Addr    `json:"ip"`
	MAC   macAddr       `json:"mac,omitempty"` // the pod's eth0's, the only source its port lets through; none in leases of older berthds
	Veth  string        `json:"veth"`
	Ports []PortMapping `json:"ports,omitempty"`
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

// leaseStore is a host-local IPAM. Changes hold an flock on <StateDir>/lock
// (other processes) and mu (other goroutines, and the race detector, which
// cannot see flock), and read every lease from disk, so there is no cache
// to go stale.
type leaseStore struct {
	dir    string
	lock   string
	subnet netip.Prefix

	mu   sync.Mutex
	next netip.Addr // where the next search starts, so freed addresses are reused last
}

func newLeaseStore(stateDir string, subnet netip.Prefix) *leaseStore {
	return &leaseStore{
		dir:    filepath.Join(stateDir, "leases"),
		lock:   filepath.Join(stateDir, "lock"),
		subnet: subnet,
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

// reserve leases a free address to pod, after checking that its host
// ports are free.
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
		used := make(map[netip.Addr]bool, len(all))
		for _, o := range all {
			used[o.IP] = true
		}
		ip, ok := s.free(used)
		if !ok {
			return fmt.Errorf("%w in %s (%d pods hold one)", ErrNoAddress, s.subnet, len(all))
		}
		l = &lease{Pod: pod, IP: ip, MAC: macAddr(derivedMAC(podMACKind, ip)), Veth: veth, Ports: ports}
		if err := s.write(l); err != nil {
			return err
		}
		s.next = ip.Next()
		return nil
	})
	return l, err
}

// free finds an unused address after the last one handed out, skipping the
// network, gateway and broadcast addresses.
func (s *leaseStore) free(used map[netip.Addr]bool) (netip.Addr, bool) {
	first := s.subnet.Addr().Next().Next()
	last := broadcast(s.subnet).Prev()
	start := s.next
	if !start.IsValid() || !s.subnet.Contains(start) || start.Less(first) || last.Less(start) {
		start = first
		// After a restart, continue after the highest address in use.
		for ip := range used {
			if s.subnet.Contains(ip) && !ip.Less(start) && ip.Less(last) {
				start = ip.Next()
			}
		}
	}
	ip := start
	for {
		if !used[ip] {
			return ip, true
		}
		if ip = ip.Next(); last.Less(ip) {
			ip = first
		}
		if ip == start {
			return netip.Addr{}, false
		}
	}
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(a)
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
	tmp := filepath.Join(s.dir, "."+l.Pod+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("network: write lease: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, l.Pod)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("network: write lease: %w", err)
	}
	return nil
}
