package spec

import (
	"encoding/json"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func nsMap(ns []specs.LinuxNamespace) map[specs.LinuxNamespaceType]string {
	m := map[specs.LinuxNamespaceType]string{}
	for _, n := range ns {
		m[n.Type] = n.Path
	}
	return m
}

func TestNamespaces(t *testing.T) {
	const pidPath = "/proc/42/ns/pid"
	for _, tc := range []struct {
		name   string
		mutate func(*Input)
		want   map[specs.LinuxNamespaceType]string // absent kind: shares the host's
	}{
		{
			name: "pod namespaces, container pid",
			want: map[specs.LinuxNamespaceType]string{
				specs.MountNamespace: "", specs.NetworkNamespace: "/run/berth/ns/net-1", specs.IPCNamespace: "/run/berth/ns/ipc-1",
				specs.UTSNamespace: "/run/berth/ns/uts-1", specs.PIDNamespace: "", specs.CgroupNamespace: "",
			},
		},
		{
			name:   "pod pid",
			mutate: func(in *Input) { in.PIDNS = pidPath },
			want: map[specs.LinuxNamespaceType]string{
				specs.MountNamespace: "", specs.NetworkNamespace: "/run/berth/ns/net-1", specs.IPCNamespace: "/run/berth/ns/ipc-1",
				specs.UTSNamespace: "/run/berth/ns/uts-1", specs.PIDNamespace: pidPath, specs.CgroupNamespace: "",
			},
		},
		{
			name: "host everything",
			mutate: func(in *Input) {
				in.NetNS, in.IPCNS, in.UTSNS = "", "", ""
				in.HostNet, in.HostIPC, in.HostPID = true, true, true
			},
			want: map[specs.LinuxNamespaceType]string{specs.MountNamespace: "", specs.CgroupNamespace: ""},
		},
		{
			name: "new private namespaces",
			mutate: func(in *Input) {
				in.NetNS, in.IPCNS, in.UTSNS = "", "", ""
			},
			want: map[specs.LinuxNamespaceType]string{
				specs.MountNamespace: "", specs.NetworkNamespace: "", specs.IPCNamespace: "",
				specs.UTSNamespace: "", specs.PIDNamespace: "", specs.CgroupNamespace: "",
			},
		},
		{
			name:   "privileged keeps the host cgroup namespace",
			mutate: func(in *Input) { secCtx(in).Privileged = true },
			want: map[specs.LinuxNamespaceType]string{
				specs.MountNamespace: "", specs.NetworkNamespace: "/run/berth/ns/net-1", specs.IPCNamespace: "/run/berth/ns/ipc-1",
				specs.UTSNamespace: "/run/berth/ns/uts-1", specs.PIDNamespace: "",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			if tc.mutate != nil {
				tc.mutate(&in)
			}
			s, err := Generate(in)
			if err != nil {
				t.Fatal(err)
			}
			got := nsMap(s.Linux.Namespaces)
			if len(got) != len(s.Linux.Namespaces) || len(got) != len(tc.want) {
				t.Fatalf("namespaces %+v, want %v", s.Linux.Namespaces, tc.want)
			}
			for k, v := range tc.want {
				if p, ok := got[k]; !ok || p != v {
					t.Fatalf("namespaces %+v, want %v", s.Linux.Namespaces, tc.want)
				}
			}
		})
	}

	in := baseInput(t)
	in.HostNet = true
	_, err := Generate(in)
	wantErr(t, err, "network namespace")
	in = baseInput(t)
	in.PIDNS, in.HostPID = "/proc/1/ns/pid", true
	_, err = Generate(in)
	wantErr(t, err, "pid namespace")
}

func TestHostname(t *testing.T) {
	in := baseInput(t)
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if s.Hostname != "pod-host" {
		t.Fatalf("hostname %q", s.Hostname)
	}
	in.NetNS, in.UTSNS, in.HostNet = "", "", true
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if s.Hostname != "" {
		t.Fatalf("hostname %q with the host's UTS namespace", s.Hostname)
	}
}

func TestSysctls(t *testing.T) {
	in := baseInput(t)
	in.Pod.Linux = &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{
		"kernel.shm_rmid_forced":            "1",
		"fs.mqueue.msg_max":                 "100",
		"net.ipv4.ip_forward":               "1",
		"net/ipv4/conf/eth0.100/rp_filter":  "0",
		"kernel.domainname":                 "example.org",
		"net.ipv4.ip_local_port_range":      "1024 65000",
		"net.ipv4.ping_group_range":         "0 2147483647",
		"kernel.sem":                        "250 32000 100 128",
		"net.ipv4.conf.all.route_localnet":  "1",
		"net.ipv6.conf.all.disable_ipv6":    "1",
		"net.core.somaxconn":                "1024",
		"net.ipv4.tcp_keepalive_time":       "600",
		"net.ipv4.conf.default.rp_filter":   "1",
		"net.netfilter.nf_conntrack_max":    "1",
		"kernel.msgmax":                     "8192",
		"net.ipv4.conf.eth0/100.rp_filter2": "1",
	}}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Sysctl) != 16 || s.Linux.Sysctl["kernel.shm_rmid_forced"] != "1" ||
		s.Linux.Sysctl["net.ipv4.conf.eth0/100.rp_filter"] != "0" || s.Linux.Sysctl["kernel.domainname"] != "example.org" {
		t.Fatalf("sysctls %v", s.Linux.Sysctl)
	}

	for _, tc := range []struct {
		key    string
		mutate func(*Input)
		err    string
	}{
		{key: "net.core.somaxconn", mutate: func(in *Input) { in.NetNS, in.UTSNS, in.HostNet = "", "", true }, err: "host network"},
		{key: "kernel.shmmax", mutate: func(in *Input) { in.IPCNS, in.HostIPC = "", true }, err: "host IPC"},
		{key: "fs.mqueue.queues_max", mutate: func(in *Input) { in.IPCNS, in.HostIPC = "", true }, err: "host IPC"},
		{key: "kernel.hostname", mutate: func(in *Input) { in.NetNS, in.UTSNS, in.HostNet = "", "", true }, err: "host UTS"},
		{key: "vm.swappiness", err: "not namespaced"},
		{key: "kernel.panic", err: "not namespaced"},
	} {
		in := baseInput(t)
		if tc.mutate != nil {
			tc.mutate(&in)
		}
		in.Pod.Linux = &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{tc.key: "1"}}
		_, err := Generate(in)
		wantErr(t, err, `"`+tc.key+`"`, tc.err)
	}
}

func TestAnnotationsResourcesCgroups(t *testing.T) {
	in := baseInput(t)
	in.Config.Annotations = map[string]string{"a": "1", AnnotationContainerType: "spoofed"}
	in.Config.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{OomScoreAdj: -998}}
	limit := int64(64 << 20)
	major := int64(8)
	in.Resources = &specs.LinuxResources{
		Memory:  &specs.LinuxMemory{Limit: &limit},
		Devices: []specs.LinuxDeviceCgroup{{Allow: true, Type: "b", Major: &major, Access: "r"}},
	}
	in.CgroupsPath = "kubepods-besteffort.slice:berth:c1"
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"a": "1", AnnotationContainerType: "container", AnnotationContainerName: "app",
		AnnotationImageName: "docker.io/library/busybox:latest", AnnotationSandboxName: "pod",
		AnnotationSandboxNamespace: "ns", AnnotationSandboxUID: "uid-1",
	}
	for k, v := range want {
		if s.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, s.Annotations[k], v)
		}
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj != -998 {
		t.Fatalf("oom_score_adj %v", s.Process.OOMScoreAdj)
	}
	r := s.Linux.Resources
	if r.Memory == nil || *r.Memory.Limit != limit {
		t.Fatalf("memory %+v", r.Memory)
	}
	n := len(DefaultDeviceRules())
	if len(r.Devices) != n+1 || !isRule(r.Devices[0], false, "", -1, -1, "rwm") || !isRule(r.Devices[n], true, "b", 8, -1, "r") {
		t.Fatalf("devices %+v", r.Devices)
	}
	if len(in.Resources.Devices) != 1 {
		t.Fatal("the caller's resources were changed")
	}
	if s.Linux.CgroupsPath != in.CgroupsPath {
		t.Fatalf("cgroups path %q", s.Linux.CgroupsPath)
	}

	// No resources at all: still the device rules.
	in = baseInput(t)
	s, err = Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.OOMScoreAdj != nil || s.Linux.Resources == nil || len(s.Linux.Resources.Devices) != n {
		t.Fatalf("process %+v resources %+v", s.Process, s.Linux.Resources)
	}
}

func TestGenerateUserAndBasics(t *testing.T) {
	in := baseInput(t)
	in.Image.User = "www-data"
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != specs.Version || s.Process.User.UID != 33 || s.Process.User.GID != 33 ||
		!slices.Equal(s.Process.User.AdditionalGids, []uint32{33, 50}) {
		t.Fatalf("spec %+v user %+v", s, s.Process.User)
	}
	if !slices.Equal(s.Process.Args, []string{"/bin/sh", "-c", "true"}) {
		t.Fatalf("args %q", s.Process.Args)
	}
	if _, err := json.Marshal(s); err != nil {
		t.Fatal(err)
	}

	in.Image.User = "ghost"
	_, err = Generate(in)
	wantErr(t, err, `"ghost"`)

	in = baseInput(t)
	in.RootfsPath = "relative/rootfs"
	_, err = Generate(in)
	wantErr(t, err, "rootfs")
	_, err = Generate(Input{RootfsPath: "/x"})
	wantErr(t, err, "container config")
}
