package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var nsKinds = []string{"net", "ipc", "uts", "pid", "mnt"}

// hostNamespaces are the test's (and berthd's) namespaces, by kind.
func hostNamespaces(t *testing.T) map[string]string {
	t.Helper()
	ns := map[string]string{}
	for _, k := range nsKinds {
		l, err := os.Readlink("/proc/self/ns/" + k)
		if err != nil {
			t.Fatal(err)
		}
		ns[k] = l
	}
	return ns
}

// ctrNamespaces are a container's namespaces, as a process exec'd in it
// sees them.
func (e *podEnv) ctrNamespaces(t *testing.T, ctr string) map[string]string {
	t.Helper()
	out := e.sh(t, ctr, "for n in "+strings.Join(nsKinds, " ")+"; do /bin/busybox readlink /proc/self/ns/$n; done")
	lines := strings.Split(out, "\n")
	if len(lines) != len(nsKinds) {
		t.Fatalf("namespaces of %s: %q", ctr, out)
	}
	ns := map[string]string{}
	for i, k := range nsKinds {
		ns[k] = lines[i]
	}
	return ns
}

// cmdlines lists the command lines of the processes a container sees, one
// per line, arguments separated by spaces.
func (e *podEnv) cmdlines(t *testing.T, ctr string) string {
	t.Helper()
	return e.sh(t, ctr, `for p in /proc/[0-9]*; do /bin/busybox tr '\0' ' ' < $p/cmdline; echo; done`)
}

func podWithNamespaces(e *podEnv, name string, o *runtimeapi.NamespaceOption) *runtimeapi.PodSandboxConfig {
	cfg := e.podConfig(name)
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: o}
	return cfg
}

// TestPodNamespaces checks how the containers of a pod share namespaces:
// network, IPC and UTS with each other (never with the host) and, as the
// kubelet asks by default, a PID namespace each in which their process is
// PID 1; with a POD-scoped PID namespace one for the pod whose PID 1 is the
// built-in pause; with NODE namespaces the host's.
func TestPodNamespaces(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	host := hostNamespaces(t)
	mode := func(net, ipc, pid runtimeapi.NamespaceMode) *runtimeapi.NamespaceOption {
		return &runtimeapi.NamespaceOption{Network: net, Ipc: ipc, Pid: pid}
	}
	const pod, ctrNS, node = runtimeapi.NamespaceMode_POD, runtimeapi.NamespaceMode_CONTAINER, runtimeapi.NamespaceMode_NODE

	t.Run("pod-scoped", func(t *testing.T) {
		cfg := podWithNamespaces(e, "ns-pod", mode(pod, pod, ctrNS))
		id := e.runPod(t, cfg)
		if o := e.podStatus(t, id).GetLinux().GetNamespaces().GetOptions(); !proto.Equal(o, mode(pod, pod, ctrNS)) {
			t.Errorf("PodSandboxStatus namespace options = %v, want the pod's", o)
		}
		var ctrs []string
		var nss []map[string]string
		for i := range 3 {
			ctrs = append(ctrs, e.runContainer(t, id, cfg, e.ctrConfig(fmt.Sprint("c", i), "/bin/sleep", fmt.Sprint(100001+i))))
			nss = append(nss, e.ctrNamespaces(t, ctrs[i]))
		}
		for i, ns := range nss {
			for _, k := range nsKinds {
				if ns[k] == host[k] {
					t.Errorf("container %d shares the host's %s namespace %s", i, k, ns[k])
				}
			}
			for _, k := range []string{"net", "ipc", "uts"} {
				if ns[k] != nss[0][k] {
					t.Errorf("container %d: %s namespace %s, container 0 has %s", i, k, ns[k], nss[0][k])
				}
			}
			for j := range i {
				for _, k := range []string{"pid", "mnt"} {
					if ns[k] == nss[j][k] {
						t.Errorf("containers %d and %d share the %s namespace %s", i, j, k, ns[k])
					}
				}
			}
			// Each is PID 1 of its own PID namespace and sees no other. Its
			// command line is waited for: StartContainer answers once the
			// init's exec has begun, which it may not have finished.
			want := fmt.Sprintf("/bin/sleep %d ", 100001+i)
			var got string
			if !eventually(10*time.Second, func() bool {
				got = e.sh(t, ctrs[i], `/bin/busybox tr '\0' ' ' < /proc/1/cmdline`)
				return got == want
			}) {
				t.Errorf("container %d: PID 1 is %q, want %q", i, got, want)
			}
			procs := e.cmdlines(t, ctrs[i])
			for j := range ctrs {
				if j != i && strings.Contains(procs, fmt.Sprint(100001+j)) {
					t.Errorf("container %d sees container %d's process:\n%s", i, j, procs)
				}
			}
		}
		// One IPC namespace, one /dev/shm.
		e.sh(t, ctrs[0], "echo shared > /dev/shm/note")
		if got := e.sh(t, ctrs[2], "cat /dev/shm/note"); got != "shared" {
			t.Errorf("container 2 reads %q from the pod's /dev/shm", got)
		}
		e.removePod(t, id)
	})

	t.Run("shared-pid", func(t *testing.T) {
		cfg := podWithNamespaces(e, "ns-shared-pid", mode(pod, pod, pod))
		id := e.runPod(t, cfg)
		a := e.runContainer(t, id, cfg, e.ctrConfig("a", "/bin/sleep", "200001"))
		b := e.runContainer(t, id, cfg, e.ctrConfig("b", "/bin/sleep", "200002"))
		nsA, nsB := e.ctrNamespaces(t, a), e.ctrNamespaces(t, b)
		if nsA["pid"] != nsB["pid"] || nsA["pid"] == host["pid"] {
			t.Errorf("PID namespaces: a %s, b %s, host %s; want a = b, not the host's", nsA["pid"], nsB["pid"], host["pid"])
		}
		for name, ctr := range map[string]string{"a": a, "b": b} {
			if got := e.sh(t, ctr, `/bin/busybox tr '\0' ' ' < /proc/1/cmdline`); got != "/pause " {
				t.Errorf("%s: PID 1 is %q, want the built-in pause", name, got)
			}
			procs := e.cmdlines(t, ctr)
			for _, want := range []string{"/bin/sleep 200001", "/bin/sleep 200002", "/pause"} {
				if !strings.Contains(procs, want) {
					t.Errorf("%s does not see %q:\n%s", name, want, procs)
				}
			}
		}
		e.removePod(t, id)
	})

	t.Run("node", func(t *testing.T) {
		cfg := podWithNamespaces(e, "ns-node", mode(node, node, node))
		id := e.runPod(t, cfg)
		ctr := e.runContainer(t, id, cfg, e.ctrConfig("c", sleeper...))
		ns := e.ctrNamespaces(t, ctr)
		for _, k := range []string{"net", "ipc", "pid", "uts"} {
			if ns[k] != host[k] {
				t.Errorf("%s namespace %s, want the host's %s", k, ns[k], host[k])
			}
		}
		if ns["mnt"] == host["mnt"] {
			t.Errorf("the container shares the host's mount namespace")
		}
		// Host network: the host's interfaces (those that were there before
		// and after the read: other tests add and remove pods' veths).
		before := hostInterfaces(t)
		dev := e.sh(t, ctr, "cat /proc/net/dev")
		seen := map[string]bool{}
		for _, line := range strings.Split(dev, "\n") {
			if name, _, ok := strings.Cut(line, ":"); ok {
				seen[strings.TrimSpace(name)] = true
			}
		}
		for name := range hostInterfaces(t) {
			if before[name] && !seen[name] {
				t.Errorf("host interface %s not in the container's /proc/net/dev:\n%s", name, dev)
			}
		}
		// Host PID: the host's processes, this test among them.
		self, err := os.ReadFile("/proc/self/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		if got := e.exec(t, ctr, "/bin/cat", "/proc/"+strconv.Itoa(os.Getpid())+"/cmdline").stdout; got != string(self) {
			t.Errorf("the container reads %q as the test's command line, want %q", got, self)
		}
		// Host UTS (with the host network): the node's name.
		if name, _ := os.Hostname(); e.sh(t, ctr, "hostname") != name {
			t.Errorf("hostname is not the node's %q", name)
		}
		// Host IPC: the host's /dev/shm.
		note := "berth-itest-" + id[:12]
		t.Cleanup(func() { os.Remove(filepath.Join("/dev/shm", note)) })
		e.sh(t, ctr, "echo from the pod > /dev/shm/"+note)
		if b, err := os.ReadFile(filepath.Join("/dev/shm", note)); err != nil || string(b) != "from the pod\n" {
			t.Errorf("host /dev/shm/%s: %q, %v", note, b, err)
		}
		e.removePod(t, id)
	})
	e.assertNoLeaks(t)
}

func hostInterfaces(t *testing.T) map[string]bool {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, i := range ifs {
		names[i.Name] = true
	}
	return names
}
