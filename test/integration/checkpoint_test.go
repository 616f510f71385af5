package integration

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criuWorks says whether CRIU can checkpoint on this machine, asked as
// berthd asks (`criu check`). This host's kernel fails it; the VM tier's
// Debian kernel, with Debian's criu on its disk, passes, and must.
func criuWorks(t *testing.T) bool {
	t.Helper()
	bin, err := exec.LookPath("criu")
	works := err == nil && exec.Command(bin, "check").Run() == nil
	if !works && os.Getenv("BERTH_VM") == "1" {
		t.Fatalf("the VM tier has no working criu (look up: %v): test/vm/run.sh puts Debian's on its disk", err)
	}
	return works
}

// counterScript counts in /counter, serves /www on TCP 8080 with busybox
// httpd, writes a file of its own and deletes one of the image's, so that
// the checkpoint has process state, a listening socket and layer changes.
const counterScript = `mkdir -p /www && echo served > /www/index.html && echo kept > /written-by-container && rm /etc/group &&
/bin/busybox httpd -f -p 8080 -h /www & i=0; while true; do i=$((i+1)); echo $i > /counter; sleep 0.2; done`

// counter is the container's count now. The shell truncates /counter
// before it writes the next count, so a read can find it empty.
func (e *podEnv) counter(t *testing.T, id string) int {
	t.Helper()
	var n int
	var err error
	if !eventually(30*time.Second, func() bool {
		n, err = strconv.Atoi(e.sh(t, id, "cat /counter"))
		return err == nil
	}) {
		t.Fatalf("counter of %s: %v", id, err)
	}
	return n
}

// criuGate is the CRIU configuration file of berthd's [checkpoint]
// criu_config, read at each checkpoint: empty, or, while held, one that
// has CRIU log into a fifo whose buffer the test shrinks to a page and
// stops reading once CRIU dumps the container's processes (seized): CRIU, and its parasite code in the process it
// dumps, which logs there too, block on the next page of log, and the
// checkpoint can never finish, whatever the machine's pace.
type criuGate struct {
	config, log string
}

func newCRIUGate(t *testing.T) *criuGate {
	t.Helper()
	dir := t.TempDir()
	g := &criuGate{config: filepath.Join(dir, "criu.conf"), log: filepath.Join(dir, "criu.log")}
	if err := unix.Mkfifo(g.log, 0o600); err != nil {
		t.Fatal(err)
	}
	g.set(t, "")
	return g
}

func (g *criuGate) set(t *testing.T, conf string) {
	t.Helper()
	if err := os.WriteFile(g.config, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}

// hold has the next checkpoint log into the fifo, opened here for reading
// (CRIU's open waits for a reader): reach reads until CRIU logs that it
// dumps a process, then leaves the fifo unread and open; drain reads it to
// its end, once its writers are gone (CRIU killed, its parasite code out
// of the process it was in: it leaves once CRIU's socket closes and its
// last log line is written).
func (g *criuGate) hold(t *testing.T) (reach, drain func(time.Duration) (bool, string)) {
	t.Helper()
	g.set(t, "log-file "+g.log+"\n")
	fd, err := unix.Open(g.log, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, os.Getpagesize()); err != nil {
		t.Fatal(err)
	}
	reach = func(d time.Duration) (bool, string) {
		var log []byte
		buf := make([]byte, 4096)
		found := eventually(d, func() bool {
			for {
				n, err := unix.Read(fd, buf)
				if n <= 0 || err != nil {
					return false
				}
				log = append(log, buf[:n]...)
				if strings.Contains(string(log), "Dumping task") {
					return true
				}
			}
		})
		return found, string(lastBytes(log, 2000))
	}
	drain = func(d time.Duration) (bool, string) {
		buf := make([]byte, 4096)
		var last []byte
		found := eventually(d, func() bool {
			for {
				n, err := unix.Read(fd, buf)
				if n == 0 && err == nil {
					return true // every writer closed it
				}
				if n < 0 || err != nil {
					return false
				}
				last = lastBytes(append(last, buf[:n]...), 2000)
			}
		})
		return found, string(last)
	}
	return reach, drain
}

func (g *criuGate) release(t *testing.T) { g.set(t, "") }

// heldCheckpointTimeout is the timeout of a checkpoint the gate holds:
// how long CRIU is given to reach the gate, which it does part way
// through a checkpoint, scaled from took, how long a whole checkpoint of
// the same containers took on this machine just before: five times that,
// room for the machine's load to change, and at least 15 s. A bound fixed
// for the slowest machine is waited out whole: 90 s had TestCheckpointPod
// idle some 80 s of the VM tier's serial part (2026-11-29).
func heldCheckpointTimeout(took time.Duration) time.Duration {
	return max(15*time.Second, 5*took).Round(time.Second)
}

// toml is berthd's config for the gate.
func (g *criuGate) toml() string { return "\n[checkpoint]\ncriu_config = \"" + g.config + "\"\n" }

// assertCounts fails t unless the container's counter moves on: it runs,
// neither stopped nor left frozen.
func (e *podEnv) assertCounts(t *testing.T, id, after string) {
	t.Helper()
	n := e.counter(t, id)
	if !eventually(30*time.Second, func() bool { return e.counter(t, id) > n }) {
		t.Errorf("%s: the counter stays at %d after %s: the container does not run", id, n, after)
	}
}

// assertNothingAt fails t if anything is at location or beside it in dir
// (an archive, or a work folder of CRIU's images).
func assertNothingAt(t *testing.T, dir, location string) {
	t.Helper()
	if _, err := os.Lstat(location); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists after a failed checkpoint (%v)", location, err)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		var names []string
		for _, l := range left {
			names = append(names, l.Name())
		}
		t.Errorf("left beside the location after a failed checkpoint: %v", names)
	}
}

// readArchive unpacks a checkpoint archive into a new folder and returns
// it with the archive's names.
func readArchive(t *testing.T, archive string) (dir string, names []string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir = t.TempDir()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return dir, names
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		names = append(names, strings.TrimSuffix(hdr.Name, "/"))
		path := filepath.Join(dir, hdr.Name)
		if hdr.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(path, 0o700); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err == nil {
			err = os.WriteFile(path, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The tests that run CRIU are not parallel: breakHostRuncConf's file and
// the look for a CRIU process that outlived its checkpoint are the node's.

// breakHostRuncConf puts, in the VM tier (a machine of the test's own), a
// /etc/criu/runc.conf that would fail any dump (its images to a folder that
// does not exist): libcontainer gives CRIU that file unless the
// container's spec names another. Elsewhere the host's file is left alone.
func breakHostRuncConf(t *testing.T) {
	t.Helper()
	const conf = "/etc/criu/runc.conf"
	if os.Getenv("BERTH_VM") != "1" {
		return
	}
	if _, err := os.Stat(conf); err == nil {
		t.Fatalf("the VM's disk has a %s", conf)
	}
	if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("images-dir /berth-test-no-such-folder\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(conf) })
}

// containerCgroupFile is the path of file in the cgroup v2 folder of the
// container id, under its pod's cgroup.
func containerCgroupFile(t *testing.T, podCgroup, id, file string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", podCgroup, "*"+id+"*", file))
	if len(m) != 1 {
		t.Fatalf("the cgroup of %s under %s: %v", id, podCgroup, m)
	}
	return m[0]
}

// processRuns says whether a process's command line mentions s.
func processRuns(s string) bool {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range cmdlines {
		if b, err := os.ReadFile(c); err == nil && strings.Contains(string(b), s) {
			return true
		}
	}
	return false
}

// processStates names each process of a cgroup folder with its state and
// where it waits, for a failure's message.
func processStates(cgroup string) string {
	b, _ := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	var states []string
	for _, pid := range strings.Fields(string(b)) {
		stat, _ := os.ReadFile("/proc/" + pid + "/stat")
		wchan, _ := os.ReadFile("/proc/" + pid + "/wchan")
		if f := strings.Fields(string(stat)); len(f) > 2 {
			states = append(states, pid+" "+f[1]+" "+f[2]+" "+string(wchan))
		}
	}
	return strings.Join(states, "; ")
}

// lastBytes is the end of b, at most n bytes of it.
func lastBytes(b []byte, n int) []byte { return b[max(0, len(b)-n):] }

// tarFiles reads a tar's regular files by name.
func tarFiles(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string]string{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(tr)
		files[hdr.Name] = string(b)
	}
}

// TestCheckpointContainer: CheckpointContainer writes, where CRIU works,
// the archive containerd and CRI-O write (read here with checkpointctl,
// test/checkpointctl's version) and leaves the container running; its refusals leave nothing
// behind and the container running: where CRIU does not work (this host),
// for a container CRIU cannot take (the reason from CRIU's log), past the
// timeout, and for bad requests.
func TestCheckpointContainer(t *testing.T) {
	gate := newCRIUGate(t)
	e := startPodEnvTOML(t, v1.Config{}, gate.toml())
	podCfg := e.podConfig("ckpt")
	pod := e.runPod(t, podCfg)
	ctr := e.runContainer(t, pod, podCfg, e.ctrConfig("counter", "/bin/sh", "-c", counterScript))
	if !eventually(30*time.Second, func() bool {
		return e.exec(t, ctr, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/").stdout == "served\n"
	}) {
		t.Fatal("the container's httpd does not answer")
	}
	dir := t.TempDir()
	location := filepath.Join(dir, "counter.tar")
	checkpoint := func(id, location string, timeout int64) error {
		_, err := e.d.Runtime.CheckpointContainer(t.Context(), &runtimeapi.CheckpointContainerRequest{
			ContainerId: id, Location: location, Timeout: timeout})
		return err
	}

	// Requests that cannot be served, wherever CRIU works or not.
	assertCode(t, checkpoint(ctr, "counter.tar", 0), one(codes.InvalidArgument), "absolute")
	assertCode(t, checkpoint(ctr, dir, 0), one(codes.InvalidArgument), "folder")
	assertCode(t, checkpoint(ctr, filepath.Join(dir, "no", "such.tar"), 0), one(codes.InvalidArgument), "does not exist")
	assertCode(t, checkpoint(ctr, location, -1), one(codes.InvalidArgument), "timeout")
	assertCode(t, checkpoint("", location, 0), one(codes.InvalidArgument), "container_id")
	assertCode(t, checkpoint("no-such-container", location, 0), one(codes.NotFound))

	if !criuWorks(t) {
		err := checkpoint(ctr, location, 0)
		assertCode(t, err, one(codes.FailedPrecondition), "criu")
		assertNothingAt(t, dir, location)
		e.assertCounts(t, ctr, "a refused checkpoint")
		e.removePod(t, pod)
		e.assertNoLeaks(t)
		return
	}

	// The host's runc.conf, which runc gives CRIU, would fail this
	// checkpoint: berth's configuration is the one CRIU takes.
	breakHostRuncConf(t)
	start := time.Now()
	if err := checkpoint(ctr, location, 0); err != nil {
		t.Fatalf("CheckpointContainer: %v", err)
	}
	took := time.Since(start)
	t.Logf("checkpoint took %s", took.Round(time.Millisecond))
	e.assertCounts(t, ctr, "the checkpoint")
	if got := e.exec(t, ctr, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/").stdout; got != "served\n" {
		t.Errorf("httpd after the checkpoint answers %q, want %q", got, "served\n")
	}
	if fi, err := os.Stat(location); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("archive: %v, mode %v; want it readable by root only", err, fi.Mode())
	}
	out, names := readArchive(t, location)
	for _, want := range []string{"checkpoint/inventory.img", "checkpoint/pstree.img", "checkpoint/descriptors.json",
		"config.dump", "spec.dump", "rootfs-diff.tar", "deleted.files", "dump.log", "stats-dump"} {
		if !slices.Contains(names, want) {
			t.Errorf("the archive has no %s: %v", want, names)
		}
	}
	assertCheckpointctlReads(t, location, checkpointctlView{container: "counter", image: e.image, id: ctr, pod: "ckpt", after: start})
	var deleted []string
	if b, err := os.ReadFile(filepath.Join(out, "deleted.files")); err != nil || json.Unmarshal(b, &deleted) != nil || !slices.Equal(deleted, []string{"/etc/group"}) {
		t.Errorf("deleted.files: %s (%v), want [\"/etc/group\"]", b, err)
	}
	diff := tarFiles(t, filepath.Join(out, "rootfs-diff.tar"))
	if diff["written-by-container"] != "kept\n" || diff["www/index.html"] != "served\n" {
		t.Errorf("rootfs-diff.tar lacks the files the container wrote: %v", slices.Sorted(maps.Keys(diff)))
	}
	for name := range diff {
		if name == "etc/hosts" || strings.HasPrefix(name, "proc/") || strings.HasPrefix(name, "dev/") {
			t.Errorf("rootfs-diff.tar has %s, a mount point's stub", name)
		}
	}
	var descriptors []string
	if b, err := os.ReadFile(filepath.Join(out, "checkpoint", "descriptors.json")); err != nil || json.Unmarshal(b, &descriptors) != nil || len(descriptors) != 3 {
		t.Errorf("descriptors.json: %s (%v), want the init's three stdio", b, err)
	}

	// Past its timeout the checkpoint is stopped: CRIU, held by the gate
	// with the container's processes seized, is killed; the container's
	// cgroup is thawed, its processes run on, the pod's network answers,
	// nothing is left. The timeout bounds only how long CRIU may take to
	// reach the gate.
	lateTimeout := heldCheckpointTimeout(took)
	reach, drain := gate.hold(t)
	late := filepath.Join(dir, "late.tar")
	if err := os.Remove(location); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- checkpoint(ctr, late, int64(lateTimeout/time.Second)) }()
	if ok, log := reach(lateTimeout); !ok {
		t.Fatalf("CRIU did not log dumping a process within the checkpoint's %s; its log ends %q; the checkpoint answered %v", lateTimeout, log, <-done)
	}
	events := containerCgroupFile(t, e.podCgroup(t, pod), ctr, "cgroup.events")
	// Once it dumps, CRIU holds every process it has not entered with its
	// parasite code in a ptrace stop ("t").
	if states := processStates(filepath.Dir(events)); !strings.Contains(states, " t ") {
		t.Errorf("while CRIU is held no process of the container is in a ptrace stop: %s", states)
	}
	assertCode(t, <-done, one(codes.DeadlineExceeded), "timed out")
	gate.release(t)
	if ok, log := drain(30 * time.Second); !ok {
		t.Errorf("CRIU's log has writers 30 s after the checkpoint stopped at its timeout; it ends %q", log)
	}
	assertNothingAt(t, dir, late)
	// CRIU is "criu swrk", retitled "dump --rpc" once it dumps.
	if !eventually(30*time.Second, func() bool { return !processRuns("criu\x00swrk") && !processRuns("dump --rpc") }) {
		t.Error("CRIU outlived the checkpoint stopped at its timeout")
	}
	if got := readIfExists(t, events); !strings.Contains(got, "frozen 0") {
		t.Errorf("after a checkpoint stopped at its timeout the container's cgroup is frozen: %s", got)
	}
	e.assertCounts(t, ctr, "a checkpoint stopped at its timeout")
	if states := processStates(filepath.Dir(events)); strings.Contains(states, " t ") {
		t.Errorf("after a checkpoint stopped at its timeout a process of the container is in a ptrace stop: %s", states)
	}
	// CRIU locks the pod's network while it dumps (rules that drop every
	// packet); killed, it leaves them: the shim takes them away.
	if r := e.exec(t, ctr, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/"); r.stdout != "served\n" {
		t.Errorf("the pod's network after a checkpoint stopped at its timeout: wget exit %d, %q %q", r.code, r.stdout, r.stderr)
	}

	// CRIU refuses a process with an established TCP connection (berth
	// does not lock the pod's network to take them): the reason from its
	// log, nothing left, the container runs on.
	connected := e.runContainer(t, pod, podCfg, e.ctrConfig("connected", "/bin/sh", "-c",
		`(sleep 100000 | /bin/busybox nc -l -p 9000 >/dev/null) & sleep 1; (sleep 100000 | /bin/busybox nc 127.0.0.1 9000 >/dev/null) &
i=0; while true; do i=$((i+1)); echo $i > /counter; sleep 0.2; done`))
	// The client's socket: remote port 9000 (0x2328), state 01
	// (ESTABLISHED); the listener is IPv6's, dual-stack. Each nc's stdin
	// stays open: at its end nc would close the connection.
	if !eventually(30*time.Second, func() bool {
		return e.exec(t, connected, "/bin/sh", "-c", "cat /proc/net/tcp* | grep -q ':2328 01 '").code == 0
	}) {
		t.Fatalf("the connection on port 9000 is not established: %s", e.sh(t, connected, "cat /proc/net/tcp*; ps"))
	}
	conn := filepath.Join(dir, "conn.tar")
	assertCode(t, checkpoint(connected, conn, 0), one(codes.FailedPrecondition), "TCP")
	assertNothingAt(t, dir, conn)
	e.assertCounts(t, connected, "a checkpoint CRIU refused")

	e.stop(t, ctr, 10)
	assertCode(t, checkpoint(ctr, location, 0), one(codes.FailedPrecondition), "not running")
	assertNothingAt(t, dir, location)
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// TestCRIUConfigAnnotationRefused: libcontainer has CRIU, as the node's
// root, take the configuration file the annotation org.criu.config names
// (and with it action scripts to run); a pod or container asking for it is
// refused and nothing is made, and every container's spec names berth's
// own file, in its bundle.
func TestCRIUConfigAnnotationRefused(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
	const criuConfig = "org.criu.config"
	evil := map[string]string{criuConfig: "/proc/self/root/tmp/criu.conf"}

	badPod := e.podConfig("criu-pod")
	badPod.Annotations = evil
	_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: badPod})
	assertCode(t, err, one(codes.InvalidArgument), criuConfig)
	if pods, err := e.d.Runtime.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{}); err != nil || len(pods.Items) != 0 {
		t.Errorf("after the refused pod: %v pods (%v), want none", len(pods.GetItems()), err)
	}

	podCfg := e.podConfig("criu")
	pod := e.runPod(t, podCfg)
	bad := e.ctrConfig("criu", "/bin/sleep", "100000")
	bad.Annotations = evil
	_, err = e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: bad, SandboxConfig: podCfg})
	assertCode(t, err, one(codes.InvalidArgument), criuConfig)
	if ctrs, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{}); err != nil || len(ctrs.Containers) != 0 {
		t.Errorf("after the refused container: %v containers (%v), want none", len(ctrs.GetContainers()), err)
	}

	ctr := e.createContainer(t, pod, podCfg, "plain", "/bin/sleep", "100000")
	bundle := filepath.Join(e.d.State, "pods", pod, "containers", ctr)
	var spec struct{ Annotations map[string]string }
	if err := json.Unmarshal([]byte(readIfExists(t, filepath.Join(bundle, "config.json"))), &spec); err != nil {
		t.Fatal(err)
	}
	if got, want := spec.Annotations[criuConfig], filepath.Join(bundle, "criu.conf"); got != want {
		t.Errorf("the spec's %s is %q, want berth's %q", criuConfig, got, want)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
