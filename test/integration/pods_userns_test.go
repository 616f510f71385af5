package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestUsernsOptionsRefused sends user-namespace requests berth cannot
// honour: each RunPodSandbox fails with the field named and leaves nothing
// behind, and a pod with mode NODE runs in the host's user namespace.
func TestUsernsOptionsRefused(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	idmap := func(container, host, length uint32) []*runtimeapi.IDMapping {
		return []*runtimeapi.IDMapping{{ContainerId: container, HostId: host, Length: length}}
	}
	good := idmap(0, 100000, 65536)
	const field = "namespace_options.userns_options"
	for _, c := range []struct {
		name    string
		opts    *runtimeapi.UserNamespace
		code    codes.Code
		mention string
	}{
		{"mode-container", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_CONTAINER, Uids: good, Gids: good},
			codes.InvalidArgument, field + ".mode CONTAINER"},
		{"mode-target", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_TARGET, Uids: good, Gids: good},
			codes.InvalidArgument, field + ".mode TARGET"},
		{"two-uid-mappings", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD,
			Uids: append(idmap(0, 100000, 1000), idmap(1000, 200000, 1000)...), Gids: good},
			codes.InvalidArgument, field + ".uids: want exactly one mapping"},
		{"root-unmapped", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good, Gids: idmap(1, 100000, 65536)},
			codes.InvalidArgument, field + ".gids: container ID 0 is not mapped"},
		{"no-gids", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: good},
			codes.InvalidArgument, field + ".gids: want exactly one mapping"},
		{"node-with-mappings", &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE, Uids: good, Gids: good},
			codes.InvalidArgument, field + ": mode NODE takes no uids or gids"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.podConfig("userns-" + c.name)
			cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: c.opts}}
			_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
			assertCode(t, err, one(c.code), c.mention)
			e.assertNoLeaks(t)
		})
	}

	t.Run("mode-node", func(t *testing.T) {
		cfg := e.podConfig("userns-node")
		cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{UsernsOptions: &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE}}}
		pod := e.runPod(t, cfg)
		ctr := e.runContainer(t, pod, cfg, e.ctrConfig("node", sleeper...))
		if r := e.exec(t, ctr, "/bin/cat", "/proc/self/uid_map"); r.code != 0 || !isIdentityMap(r.stdout) {
			t.Errorf("uid_map of a mode NODE pod: exit %d, %q; want the host's identity map", r.code, r.stdout)
		}
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
		e.assertNoLeaks(t)
	})
}

// isIdentityMap tells the initial user namespace's map, "0 0 4294967295".
func isIdentityMap(uidMap string) bool {
	var inside, outside, length uint64
	n, _ := fmt.Sscan(uidMap, &inside, &outside, &length)
	return n == 3 && inside == 0 && outside == 0 && length == 1<<32-1
}

const usernsHost = 1_000_000 // the host IDs the test pods' IDs map to

func usernsPod(cfg *runtimeapi.PodSandboxConfig, u *runtimeapi.UserNamespace, pid runtimeapi.NamespaceMode) {
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Pid: pid, UsernsOptions: u}}
}

func rootMapping(host, length uint32) []*runtimeapi.IDMapping {
	return []*runtimeapi.IDMapping{{ContainerId: 0, HostId: host, Length: length}}
}

func hostOwner(t *testing.T, p string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

// TestUserNamespacePod runs a pod with its own user namespace (hostUsers:
// false), sharing its PID namespace so that the pause joins it too: inside
// it is root over the image's root-owned files, its pod files and a volume;
// on the host, what it writes in its writable layer belongs to the mapped
// IDs.
func TestUserNamespacePod(t *testing.T) {
	t.Parallel()
	e := startPodEnvWith(t, v1.Config{}, harness.Options{State: stateOnTmpfs(t)})
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h := st.GetRuntimeHandlers(); len(h) != 1 || !h[0].GetFeatures().GetUserNamespaces() {
		// Overlayfs takes idmapped layers from 5.19 on, and the test root
		// is on ext4 or tmpfs, which idmap: only an older kernel may refuse.
		if kernelAtLeast(t, 5, 19) {
			t.Fatalf("Linux %s: user namespaces not advertised", kernelRelease(t))
		}
		usernsRefused(t, e)
		return
	}
	vol := t.TempDir()
	if err := os.WriteFile(filepath.Join(vol, "from-host"), []byte("host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := e.podConfig("userns")
	m := rootMapping(usernsHost, 65536)
	usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
	pod := e.runPod(t, cfg)
	if o := e.podStatus(t, pod).GetLinux().GetNamespaces().GetOptions(); !proto.Equal(o, cfg.Linux.SecurityContext.NamespaceOptions) {
		t.Errorf("PodSandboxStatus namespace options = %v, want the pod's", o)
	}
	cc := e.ctrConfig("userns", sleeper...)
	// As the kubelet sends it: the volume carries the pod's mappings.
	cc.Mounts = []*runtimeapi.Mount{{HostPath: vol, ContainerPath: "/vol", UidMappings: m, GidMappings: m}}
	ctr := e.runContainer(t, pod, cfg, cc)

	if got := strings.Fields(e.sh(t, ctr, "cat /proc/self/uid_map /proc/self/gid_map")); strings.Join(got, " ") != "0 1000000 65536 0 1000000 65536" {
		t.Errorf("uid_map and gid_map inside: %v", got)
	}
	if got := strings.Fields(e.sh(t, ctr, "cat /proc/1/uid_map")); strings.Join(got, " ") != "0 1000000 65536" {
		t.Errorf("the pause (PID 1) is not in the pod's user namespace: uid_map %v", got)
	}
	if got := e.sh(t, ctr, "id -u; id -g"); got != "0\n0" {
		t.Errorf("id inside: %q, want root", got)
	}
	if got := e.sh(t, ctr, "stat -c %u:%g /bin/busybox / /etc/hosts /vol; head -c 4 /bin/busybox | wc -c; cat /vol/from-host /etc/hostname"); got != "0:0\n0:0\n0:0\n0:0\n4\nhost\nuserns" {
		t.Errorf("owners of image, rootfs, pod file and volume inside, and reads: %q", got)
	}
	// The image's /root is root's and 0700: only an idmapped layer lets the
	// pod's root (host uid 1000000) list it and write in it.
	if got := e.sh(t, ctr, "stat -c %u:%a /root; ls -A /root; echo secret > /root/made && cat /root/made"); got != "0:700\nsecret" {
		t.Errorf("the image's root-only /root inside: %q", got)
	}
	if got := e.sh(t, ctr, "cat /etc/resolv.conf >/dev/null && echo shm > /dev/shm/x && cat /dev/shm/x"); got != "shm" {
		t.Errorf("resolv.conf and /dev/shm inside: %q", got)
	}
	assertOwnedByUserNS(t, e.ctrPID(t, ctr))
	e.sh(t, ctr, "echo 127.0.0.2 extra >> /etc/hosts; touch /made-inside /vol/made-inside; touch /bin")
	upper := filepath.Join(e.d.Root, "containers", ctr, "upper")
	for _, p := range []string{filepath.Join(upper, "made-inside"), filepath.Join(upper, "bin")} {
		if uid := hostOwner(t, p); uid != usernsHost {
			t.Errorf("%s belongs to host uid %d, want %d", p, uid, usernsHost)
		}
	}
	// The volume is idmapped: the container's root is the volume's root,
	// so what it writes there is stored as 0 (as the kubelet expects).
	if uid := hostOwner(t, filepath.Join(vol, "made-inside")); uid != 0 {
		t.Errorf("a file made in the idmapped volume belongs to host uid %d, want 0", uid)
	}
	e.stop(t, ctr, 0)

	// A volume on a filesystem that cannot idmap mounts (ramfs) cannot be
	// honoured: CreateContainer refuses it, naming the mount, and leaves
	// nothing behind.
	noIDMap := t.TempDir()
	mustMount(t, "ramfs", noIDMap, "ramfs", 0)
	t.Cleanup(func() { unmountUnder(t, noIDMap) })
	cc = e.ctrConfig("userns-ramfs", sleeper...)
	cc.Mounts = []*runtimeapi.Mount{{HostPath: noIDMap, ContainerPath: "/ramfs", UidMappings: m, GidMappings: m}}
	_, err = e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
	assertCode(t, err, one(codes.FailedPrecondition), "mount /ramfs", noIDMap, "cannot idmap")
	if ids := e.listContainerIDs(t, &runtimeapi.ContainerFilter{LabelSelector: cc.Labels}); len(ids) != 0 {
		t.Errorf("the refused container is listed: %v", ids)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// stateOnTmpfs returns a folder on a tmpfs of its own for berthd's state, as
// /run/berth is on a node: the tests' temp folders are on the disk's
// filesystem, which idmaps mounts where a tmpfs may not (Linux before 6.3).
func stateOnTmpfs(t *testing.T) string {
	t.Helper()
	// Short, as harness.StartDaemon's own: the socket is in it.
	dir, err := os.MkdirTemp("", "berth-")
	if err != nil {
		t.Fatal(err)
	}
	mustMount(t, "tmpfs", dir, "tmpfs", 0)
	// Registered before berthd's cleanups, so it runs after them.
	t.Cleanup(func() {
		unmountUnder(t, dir)
		os.Remove(dir)
	})
	return dir
}

// assertOwnedByUserNS checks, from the host, that the process pid is in a
// user namespace of its own that owns its network, IPC and UTS namespaces
// (ioctl NS_GET_USERNS): the pod's namespaces were made by its user
// namespace, and the container joined them all.
func assertOwnedByUserNS(t *testing.T, pid int) {
	t.Helper()
	var userNS, hostUserNS unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &userNS); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/self/ns/user", &hostUserNS); err != nil {
		t.Fatal(err)
	}
	if userNS.Ino == hostUserNS.Ino {
		t.Fatalf("process %d is in the host's user namespace", pid)
	}
	for _, k := range []string{"net", "ipc", "uts"} {
		p := fmt.Sprintf("/proc/%d/ns/%s", pid, k)
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("NS_GET_USERNS %s: %v", p, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(owner, &st)
		unix.Close(owner)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ino != userNS.Ino {
			t.Errorf("the %s namespace of process %d is owned by user namespace %d, want the pod's %d", k, pid, st.Ino, userNS.Ino)
		}
	}
}

// usernsRefused is TestUserNamespacePod on a kernel older than 5.19, whose
// overlayfs cannot stack idmapped layers: Status says so, and such a pod is
// refused with FailedPrecondition, never run with host IDs, and leaves
// nothing behind.
func usernsRefused(t *testing.T, e *podEnv) {
	t.Logf("Linux %s: user namespaces not advertised (no overlayfs over idmapped layers); checking the refusal", kernelRelease(t))
	cfg := e.podConfig("userns-refused")
	m := rootMapping(usernsHost, 65536)
	usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
	_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("RunPodSandbox with a user namespace on a kernel without support = %v, want FailedPrecondition", err)
	}
	e.assertNoLeaks(t)
}
