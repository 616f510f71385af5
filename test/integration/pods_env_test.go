package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// readSysctl reads a sysctl of the host (of berthd's namespaces).
func readSysctl(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/")))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestPodSysctls checks that pod sysctls are set in the pod's namespaces, as
// its containers see them, and not on the host; and that a sysctl berth
// cannot set refuses the pod and leaves nothing behind.
func TestPodSysctls(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	want := map[string]string{
		"kernel.shm_rmid_forced":              "1",
		"net.ipv4.ip_unprivileged_port_start": "0",
		"net/ipv4/ping_group_range":           "0\t2147483647", // the kubelet's slash form
	}
	host := map[string]string{}
	for k, v := range want {
		k = strings.ReplaceAll(k, "/", ".")
		if host[k] = readSysctl(t, k); host[k] == v {
			t.Fatalf("host already has %s = %q: the test would prove nothing", k, v)
		}
	}

	t.Run("applied", func(t *testing.T) {
		cfg := e.podConfig("sysctls")
		cfg.Linux.Sysctls = want
		pod := e.runPod(t, cfg)
		ctrs := []string{
			e.runContainer(t, pod, cfg, e.ctrConfig("one", sleeper...)),
			e.runContainer(t, pod, cfg, e.ctrConfig("two", sleeper...)),
		}
		for _, ctr := range ctrs {
			for k, v := range want {
				path := "/proc/sys/" + strings.ReplaceAll(k, ".", "/")
				if got := e.sh(t, ctr, "cat "+path); got != v {
					t.Errorf("container %s: %s = %q, want %q", ctr, path, got, v)
				}
			}
		}
		for k, v := range host {
			if got := readSysctl(t, k); got != v {
				t.Errorf("host %s changed to %q (was %q)", k, got, v)
			}
		}
		e.removePod(t, pod)
	})

	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct {
			name, key, value string
		}{
			{"not-namespaced", "vm.overcommit_ratio", "51"},
			{"unknown-key", "net.ipv4.no_such_sysctl", "1"},
			{"bad-value", "net.ipv4.ip_unprivileged_port_start", "not-a-number"},
			{"escape", "net.ipv4.......kernel.panic", "1"},
		} {
			t.Run(c.name, func(t *testing.T) {
				before := readSysctl(t, "vm.overcommit_ratio")
				cfg := e.podConfig("bad-sysctl")
				cfg.Linux.Sysctls = map[string]string{"kernel.shm_rmid_forced": "1", c.key: c.value}
				_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
				assertCode(t, err, one(codes.InvalidArgument), c.key)
				if got := readSysctl(t, "vm.overcommit_ratio"); got != before {
					t.Errorf("host vm.overcommit_ratio changed to %s (was %s)", got, before)
					os.WriteFile("/proc/sys/vm/overcommit_ratio", []byte(before), 0)
				}
				e.assertNoLeaks(t)
			})
		}
	})
	e.assertNoLeaks(t)
}

// TestPodHostnameAndDNS checks the hostname, /etc/hostname, /etc/hosts and
// /etc/resolv.conf that containers see, with and without a DNS config.
func TestPodHostnameAndDNS(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	nodeName, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	hostResolv, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		hostname   string // in the config
		dns        *runtimeapi.DNSConfig
		wantName   string
		wantResolv string
	}{
		{
			name:     "dns-config",
			hostname: "web-0",
			dns: &runtimeapi.DNSConfig{
				Servers:  []string{"10.96.0.10", "2001:db8::53"},
				Searches: []string{"default.svc.cluster.local", "svc.cluster.local", "cluster.local"},
				Options:  []string{"ndots:5", "timeout:2", "edns0"},
			},
			wantName: "web-0",
			wantResolv: "search default.svc.cluster.local svc.cluster.local cluster.local\n" +
				"nameserver 10.96.0.10\nnameserver 2001:db8::53\noptions ndots:5 timeout:2 edns0\n",
		},
		{
			name:       "servers-only",
			hostname:   "a-rather-long-hostname-of-sixty-three-characters-abcdefghijklmn",
			dns:        &runtimeapi.DNSConfig{Servers: []string{"192.0.2.1"}},
			wantName:   "a-rather-long-hostname-of-sixty-three-characters-abcdefghijklmn",
			wantResolv: "nameserver 192.0.2.1\n",
		},
		// Without a DNS config the pod gets the node's resolv.conf; without
		// a hostname, the node's name.
		{name: "node-defaults", wantName: nodeName, wantResolv: string(hostResolv)},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.podConfig(c.name)
			cfg.Hostname, cfg.DnsConfig = c.hostname, c.dns
			pod := e.runPod(t, cfg)
			// Two containers: the files and the name are the pod's.
			for _, name := range []string{"first", "second"} {
				ctr := e.runContainer(t, pod, cfg, e.ctrConfig(name, sleeper...))
				if got := e.sh(t, ctr, "hostname"); got != c.wantName {
					t.Errorf("%s: hostname = %q, want %q", name, got, c.wantName)
				}
				if got := e.sh(t, ctr, "cat /etc/hostname"); got != c.wantName {
					t.Errorf("%s: /etc/hostname = %q, want %q", name, got, c.wantName)
				}
				if got := e.exec(t, ctr, "/bin/cat", "/etc/resolv.conf").stdout; got != c.wantResolv {
					t.Errorf("%s: /etc/resolv.conf =\n%s\nwant\n%s", name, got, c.wantResolv)
				}
				hosts := e.sh(t, ctr, "cat /etc/hosts")
				for _, line := range []string{"127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"} {
					if !strings.Contains("\n"+hosts+"\n", "\n"+line+"\n") {
						t.Errorf("%s: /etc/hosts lacks the line %q:\n%s", name, line, hosts)
					}
				}
				// The files are mounted (the pod's), not copied into the rootfs.
				mounts := e.sh(t, ctr, "cat /proc/self/mountinfo")
				for _, f := range []string{"/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/dev/shm"} {
					if !strings.Contains(mounts, " "+f+" ") {
						t.Errorf("%s: %s is not a mount:\n%s", name, f, mounts)
					}
				}
			}
			e.removePod(t, pod)
		})
	}
	t.Run("bad-dns", func(t *testing.T) {
		for _, dns := range []*runtimeapi.DNSConfig{
			{Servers: []string{"not-an-ip"}},
			{Searches: []string{"two words"}},
			{Options: []string{"ndots:5\nnameserver 6.6.6.6"}},
		} {
			cfg := e.podConfig("bad-dns")
			cfg.DnsConfig = dns
			_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
			assertCode(t, err, one(codes.InvalidArgument), "dns")
			e.assertNoLeaks(t)
		}
	})
	e.assertNoLeaks(t)
}
