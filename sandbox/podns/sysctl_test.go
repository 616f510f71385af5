package podns

import (
	"strings"
	"testing"
)

func TestSysctlKeys(t *testing.T) {
	for _, tc := range []struct {
		key  string
		kind Kind
		err  string
	}{
		{key: "net.ipv4.ip_unprivileged_port_start", kind: Net},
		{key: "net.ipv4.conf.eth0/100.rp_filter", kind: Net},
		{key: "net/ipv4/conf/eth0.100/rp_filter", kind: Net},
		{key: "kernel.shm_rmid_forced", kind: IPC},
		{key: "kernel.msgmax", kind: IPC},
		{key: "kernel.sem", kind: IPC},
		{key: "fs.mqueue.msg_max", kind: IPC},
		{key: "kernel.domainname", kind: UTS},
		{key: "vm.swappiness", err: "not namespaced"},
		// IPC-namespaced in the kernel, but not a key libcontainer takes in
		// a container's spec: refused when the pod starts, not in each
		// CreateContainer after (the two read one list now).
		{key: "kernel.shm_next_id", err: "not namespaced"},
		{key: "kernel.hostname", err: "Hostname"},
		// The key rule itself is sandbox/sysctl's, tested there; here, that
		// its refusal names the key.
		{key: "net/../../etc", err: "not a sysctl name"},
	} {
		kind, err := sysctlKind(tc.key)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.key) {
				t.Errorf("%s: err = %v, want one naming the key with %q", tc.key, err, tc.err)
			}
			continue
		}
		if err != nil || kind != tc.kind {
			t.Errorf("%s: kind %q, %v; want %q", tc.key, kind, err, tc.kind)
		}
	}
}

func TestValidate(t *testing.T) {
	for name, opts := range map[string]Options{
		"no dir":       {Kinds: []Kind{Net}},
		"bad kind":     {Dir: "/x", Kinds: []Kind{"pid"}},
		"twice":        {Dir: "/x", Kinds: []Kind{Net, Net}},
		"long host":    {Dir: "/x", Kinds: []Kind{UTS}, Hostname: strings.Repeat("h", 65)},
		"net sysctl":   {Dir: "/x", Kinds: []Kind{IPC, UTS}, Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}},
		"ipc sysctl":   {Dir: "/x", Kinds: []Kind{Net}, Sysctls: map[string]string{"kernel.shm_rmid_forced": "1"}},
		"host sysctl":  {Dir: "/x", Kinds: []Kind{Net, IPC, UTS}, Sysctls: map[string]string{"vm.swappiness": "1"}},
		"empty kinds+": {Dir: "/x", Sysctls: map[string]string{"net.core.somaxconn": "1"}},
	} {
		if err := validate(opts); err == nil {
			t.Errorf("%s: validate passed", name)
		}
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/run/a\040b\134c`); got != `/run/a b\c` {
		t.Fatalf("got %q", got)
	}
	if got := unescapeMountinfo(`/x\04`); got != `/x\04` {
		t.Fatalf("short escape: got %q", got)
	}
}
