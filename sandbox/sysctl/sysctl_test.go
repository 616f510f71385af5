package sysctl

import (
	"errors"
	"testing"
)

func TestDottedAndPath(t *testing.T) {
	for _, tc := range []struct{ key, dotted, path string }{
		{"net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_unprivileged_port_start", "/proc/sys/net/ipv4/ip_unprivileged_port_start"},
		{"net.ipv4.conf.eth0/100.rp_filter", "net.ipv4.conf.eth0/100.rp_filter", "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"},
		{"net/ipv4/conf/eth0.100/rp_filter", "net.ipv4.conf.eth0/100.rp_filter", "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"},
		{"kernel.shm_rmid_forced", "kernel.shm_rmid_forced", "/proc/sys/kernel/shm_rmid_forced"},
		{"fs/mqueue/msg_max", "fs.mqueue.msg_max", "/proc/sys/fs/mqueue/msg_max"},
		{"kernel", "kernel", "/proc/sys/kernel"},
	} {
		if d := Dotted(tc.key); d != tc.dotted {
			t.Errorf("Dotted(%q) = %q, want %q", tc.key, d, tc.dotted)
		}
		if p, err := Path(tc.key); err != nil || p != tc.path {
			t.Errorf("Path(%q) = %q, %v; want %q", tc.key, p, err, tc.path)
		}
	}
}

func TestPathRefusesMalformed(t *testing.T) {
	for _, key := range []string{
		"", "net..ipv4", "net.ipv4.", ".net", "net/../../etc", "net.a/../../kernel.core_pattern",
		"net.//.x", "net./.x", " vm.swappiness", "net.ipv4.ip\x00forward", "net.ipv4\n.x", "net.\x7f",
	} {
		if p, err := Path(key); !errors.Is(err, ErrMalformed) {
			t.Errorf("Path(%q) = %q, %v; want ErrMalformed", key, p, err)
		}
	}
}

func TestNamespaceOf(t *testing.T) {
	for key, want := range map[string]Namespace{
		"net.core.somaxconn": Net, "net.ipv4.conf.eth0/100.rp_filter": Net,
		"kernel.shm_rmid_forced": IPC, "kernel.sem": IPC, "fs.mqueue.msg_max": IPC,
		"kernel.hostname": UTS, "kernel.domainname": UTS,
		"kernel.shm_next_id": NodeWide, "vm.swappiness": NodeWide, "kernel.msg": NodeWide, "netfilter.x": NodeWide,
	} {
		if got := NamespaceOf(key); got != want {
			t.Errorf("NamespaceOf(%q) = %q, want %q", key, got, want)
		}
	}
}
