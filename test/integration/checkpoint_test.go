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

	metadata "github.com/checkpoint-restore/checkpointctl/lib"
	v1 "github.com/google/go-containerregistry/pkg/v1"
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

// counter is the container's count now.
func (e *podEnv) counter(t *testing.T, id string) int {
	t.Helper()
	n, err := strconv.Atoi(e.sh(t, id, "cat /counter"))
	if err != nil {
		t.Fatalf("counter of %s: %v", id, err)
	}
	return n
}

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
// the archive containerd and CRI-O write (read here with checkpointctl's
// library) and leaves the container running; its refusals leave nothing
// behind and the container running: where CRIU does not work (this host),
// for a container CRIU cannot take (the reason from CRIU's log), past the
// timeout, and for bad requests.
func TestCheckpointContainer(t *testing.T) {
	e := startPodEnv(t, v1.Config{})
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

	start := time.Now()
	if err := checkpoint(ctr, location, 0); err != nil {
		t.Fatalf("CheckpointContainer: %v", err)
	}
	t.Logf("checkpoint took %s", time.Since(start).Round(time.Millisecond))
	e.assertCounts(t, ctr, "the checkpoint")
	if got := e.exec(t, ctr, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/").stdout; got != "served\n" {
		t.Errorf("httpd after the checkpoint answers %q, want %q", got, "served\n")
	}
	if fi, err := os.Stat(location); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("archive: %v, mode %v; want it readable by root only", err, fi.Mode())
	}
	out, names := readArchive(t, location)
	for _, want := range []string{"checkpoint/inventory.img", "checkpoint/pstree.img", "checkpoint/descriptors.json",
		metadata.ConfigDumpFile, metadata.SpecDumpFile, metadata.RootFsDiffTar, metadata.DeletedFilesFile, metadata.DumpLogFile, "stats-dump"} {
		if !slices.Contains(names, want) {
			t.Errorf("the archive has no %s: %v", want, names)
		}
	}
	cfg, _, err := metadata.ReadContainerCheckpointConfigDump(out)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID != ctr || cfg.Name != "counter" || cfg.RootfsImageName != e.image || cfg.CheckpointedAt.Before(start) {
		t.Errorf("config.dump: %+v; want container %s named counter, image %s, checkpointed after %s", cfg, ctr, e.image, start)
	}
	spec, _, err := metadata.ReadContainerCheckpointSpecDump(out)
	if err != nil {
		t.Fatal(err)
	}
	// checkpointctl names a container from these (its containerd reader).
	if a := spec.Annotations; a["io.kubernetes.cri.container-name"] != "counter" || a["io.kubernetes.cri.sandbox-name"] != "ckpt" {
		t.Errorf("spec.dump annotations %v do not name the container and its pod", a)
	}
	deleted, _, err := metadata.ReadContainerCheckpointDeletedFiles(out)
	if err != nil || !slices.Equal(deleted, []string{"/etc/group"}) {
		t.Errorf("deleted.files: %v (%v), want [/etc/group]", deleted, err)
	}
	diff := tarFiles(t, filepath.Join(out, metadata.RootFsDiffTar))
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

	// Past its timeout the checkpoint is stopped: CRIU killed mid-dump,
	// the container thawed and running on, the pod's network unlocked,
	// nothing left. The container
	// holds 64 MiB in its shell's memory, which CRIU takes far longer
	// than the one second to dump where this runs (the VM tier's
	// emulated CPUs: the small container above took seconds).
	big := e.runContainer(t, pod, podCfg, e.ctrConfig("big", "/bin/sh", "-c",
		`x=$(head -c 67108864 /dev/zero | /bin/busybox tr '\000' x); i=0; while true; do i=$((i+1)); echo $i > /counter; sleep 0.2; done`))
	if !eventually(2*time.Minute, func() bool { return e.exec(t, big, "/bin/cat", "/counter").code == 0 }) {
		t.Fatal("the big container does not count")
	}
	late := filepath.Join(dir, "late.tar")
	if err := os.Remove(location); err != nil {
		t.Fatal(err)
	}
	assertCode(t, checkpoint(big, late, 1), one(codes.DeadlineExceeded), "timed out")
	assertNothingAt(t, dir, late)
	e.assertCounts(t, big, "a checkpoint stopped at its timeout")
	// CRIU locks the pod's network while it dumps (rules that drop every
	// packet); killed, it leaves them: the shim takes them away.
	if r := e.exec(t, big, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/"); r.stdout != "served\n" {
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
