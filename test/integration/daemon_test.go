package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

func TestRuntimeVersionStatusConfig(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	for _, c := range []struct {
		name   string
		config string
		driver runtimeapi.CgroupDriver
	}{
		{"default-cgroupfs", "", runtimeapi.CgroupDriver_CGROUPFS},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := harness.StartDaemon(t, harness.Options{ConfigTOML: c.config})
			v, err := d.Runtime.Version(ctx(t), &runtimeapi.VersionRequest{Version: "v1"})
			if err != nil {
				t.Fatal(err)
			}
			if v.RuntimeName != "berth" || v.RuntimeApiVersion != "v1" || v.RuntimeVersion == "" {
				t.Errorf("Version = %+v, want runtime berth, a version, API v1", v)
			}

			for _, verbose := range []bool{false, true} {
				st, err := d.Runtime.Status(ctx(t), &runtimeapi.StatusRequest{Verbose: verbose})
				if err != nil {
					t.Fatal(err)
				}
				conds := map[string]*runtimeapi.RuntimeCondition{}
				for _, c := range st.GetStatus().GetConditions() {
					conds[c.Type] = c
				}
				for _, typ := range []string{runtimeapi.RuntimeReady, runtimeapi.NetworkReady} {
					c := conds[typ]
					switch {
					case c == nil:
						t.Errorf("Status has no %s condition: %v", typ, st.GetStatus())
					case !c.Status && (c.Reason == "" || c.Message == ""):
						t.Errorf("%s is false without reason and message: %+v", typ, c)
					}
				}
				if c := conds[runtimeapi.RuntimeReady]; c != nil && !c.Status {
					t.Errorf("RuntimeReady is false: %s: %s", c.Reason, c.Message)
				}
				if verbose && len(st.Info) == 0 {
					t.Error("verbose Status has no info")
				}
				assertFeatures(t, st)
			}

			rc, err := d.Runtime.RuntimeConfig(ctx(t), &runtimeapi.RuntimeConfigRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := rc.GetLinux().GetCgroupDriver(); got != c.driver {
				t.Errorf("RuntimeConfig cgroup driver = %s, want %s", got, c.driver)
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
		})
	}
}

// assertFeatures checks what Status advertises against this kernel:
// recursive read-only mounts need mount_setattr, new in Linux 5.12.
func assertFeatures(t *testing.T, st *runtimeapi.StatusResponse) {
	t.Helper()
	if !st.GetFeatures().GetSupplementalGroupsPolicy() {
		t.Error("Status does not advertise supplemental_groups_policy")
	}
	h := st.GetRuntimeHandlers()
	if len(h) != 1 || h[0].GetName() != "" {
		t.Fatalf("runtime handlers %v, want the default one", h)
	}
	if got, want := h[0].GetFeatures().GetRecursiveReadOnlyMounts(), kernelAtLeast(t, 5, 12); got != want {
		t.Errorf("recursive_read_only_mounts = %v on Linux %s, want %v", got, kernelRelease(t), want)
	}
}

func kernelRelease(t *testing.T) string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}

// kernelAtLeast tells whether the running kernel is major.minor or later.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	var maj, min int
	if _, err := fmt.Sscanf(kernelRelease(t), "%d.%d", &maj, &min); err != nil {
		t.Fatalf("kernel release %q: %v", kernelRelease(t), err)
	}
	return maj > major || maj == major && min >= minor
}

// The systemd driver needs a running systemd: without one berthd must
// refuse to start and say why, not create cgroups systemd cannot see. (The
// VM tier runs systemd and checks RuntimeConfig reports SYSTEMD.)
func TestSystemdDriverWithoutSystemdRefusesToStart(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		t.Skip("this host runs systemd; the VM tier covers the driver")
	}
	code, out := harness.RunDaemonUntilExit(t, harness.Options{ConfigTOML: "cgroup_driver = \"systemd\"\n"})
	if code == 0 || !strings.Contains(out, "systemd") {
		t.Errorf("berthd with the systemd driver and no systemd: exit %d, output:\n%s", code, out)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	for _, c := range []struct {
		name, config, key string
	}{
		{"unknown-top-level", "bogus_key = 1\n", "bogus_key"},
		{"unknown-in-image", "[image]\nbogus_image_key = \"1m\"\n", "bogus_image_key"},
		{"unknown-in-registry", "[registry.\"docker.io\"]\nmirrorz = [\"http://127.0.0.1:1\"]\n", "mirrorz"},
		{"bad-log-level", "log_level = \"loud\"\n", "log_level"},
		{"bad-cgroup-driver", "cgroup_driver = \"cgroupv3\"\n", "cgroup_driver"},
		{"bad-pull-timeout", "[image]\npull_progress_timeout = \"soon\"\n", "pull_progress_timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			state := t.TempDir()
			code, out := harness.RunDaemonUntilExit(t, harness.Options{ConfigTOML: c.config, State: state,
				Socket: filepath.Join(state, "b.sock")})
			if code == 0 {
				t.Errorf("berthd exited 0 with config %q", c.config)
			}
			if !strings.Contains(out, c.key) {
				t.Errorf("berthd output does not name the key %q:\n%s", c.key, out)
			}
			if _, err := os.Lstat(filepath.Join(state, "b.sock")); err == nil {
				t.Error("berthd created its socket despite the bad config")
			}
		})
	}
}

func assertSocketGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket %s still there after exit (%v)", path, err)
	}
}

func TestSocketIsRootOnly(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	d := harness.StartDaemon(t, harness.Options{})
	fi, err := os.Lstat(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("socket %s: mode %s owner %d:%d, want a 0660 socket owned by root", d.Socket, fi.Mode(), st.Uid, st.Gid)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

func TestStaleSocketIsReplaced(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	state, err := os.MkdirTemp("", "berth-stale-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after berthd stopped
		// The private bind mount berthd leaves on STATE/pods, as the
		// harness unmounts it for the folders it makes.
		syscall.Unmount(filepath.Join(state, "pods"), syscall.MNT_DETACH)
		os.RemoveAll(state)
	})
	sock := filepath.Join(state, "berth.sock")
	// What a crashed berthd leaves: a socket file nobody listens on.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("stale socket not created: %v", err)
	}
	d := harness.StartDaemon(t, harness.Options{State: state, Socket: sock})
	if _, err := d.Runtime.Version(ctx(t), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatalf("berthd on a formerly stale socket: %v", err)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

func TestSecondDaemonOnSameSocketIsRefused(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	first := harness.StartDaemon(t, harness.Options{})
	code, out := harness.RunDaemonUntilExit(t, harness.Options{Socket: first.Socket})
	if code == 0 {
		t.Errorf("a second berthd on %s exited 0; output:\n%s", first.Socket, out)
	}
	if !strings.Contains(out, first.Socket) {
		t.Errorf("the refusal does not name the socket %s:\n%s", first.Socket, out)
	}
	if _, err := first.Runtime.Version(ctx(t), &runtimeapi.VersionRequest{}); err != nil {
		t.Errorf("the first berthd stopped answering: %v", err)
	}
	if _, err := os.Lstat(first.Socket); err != nil {
		t.Errorf("the first berthd's socket is gone: %v", err)
	}
	harness.AssertNoLeaks(t, first.Root, harness.WantSnapshots(0))
}

func TestSignalsExitCleanly(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			d := harness.StartDaemon(t, harness.Options{})
			d.Signal(sig)
			if code := d.WaitExit(15 * time.Second); code != 0 {
				t.Errorf("exit code %d after %s, want 0", code, sig)
			}
			assertSocketGone(t, d.Socket)
			harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
		})
	}
}

// TestSIGTERMDrainsInFlightPull sends SIGTERM in the middle of a slow pull: the
// pull completes, berthd exits 0, and after a restart the image is there.
func TestSIGTERMDrainsInFlightPull(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	p := reg.Push(t, "berth/drain:1", img)
	layer := harness.LayerDigests(t, img)[0]
	size := harness.BlobSize(t, img, layer)
	reg.Trickle(layer, int(size/10)+1, 300*time.Millisecond) // about 3 s

	type result struct {
		id  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := d.Images.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: p.Name}})
		done <- result{resp.GetImageRef(), err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for reg.Fetches(layer) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("berthd never fetched the layer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	d.Signal(syscall.SIGTERM)
	r := <-done
	if r.err != nil || r.id != p.ID {
		t.Errorf("in-flight pull during SIGTERM: %q, %v; want %s", r.id, r.err, p.ID)
	}
	if code := d.WaitExit(15 * time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	assertSocketGone(t, d.Socket)
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
	// The drained pull committed its last layer during the stop: a clean
	// stop flushes it, so that no reboot can take it.
	if left := harness.UnsyncedLayers(t, d.Root); len(left) > 0 {
		t.Errorf("layers still marked unsynced after a clean stop: %v", left)
	}

	d.Restart()
	got := mustStatus(t, d, p.Name)
	if got.Id != p.ID {
		t.Errorf("after restart: image %s, want %s", got.Id, p.ID)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

func TestFlagsOverrideConfigFile(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	other := t.TempDir()
	// The harness passes --root, --state, --socket and --log-level debug.
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: fmt.Sprintf(
		"root = %q\nstate = %q\nsocket = %q\nlog_level = \"error\"\n",
		filepath.Join(other, "root"), filepath.Join(other, "state"), filepath.Join(other, "state", "berth.sock"))})
	if es, _ := os.ReadDir(other); len(es) != 0 {
		t.Errorf("berthd used the config file's folders despite the flags: %s has %v", other, names(es))
	}
	if _, err := os.Stat(filepath.Join(d.Root, "meta.db")); err != nil {
		t.Errorf("berthd did not use --root %s: %v", d.Root, err)
	}
	d.Stop()
	if !strings.Contains(d.Logs(), "DEBUG") {
		t.Errorf("log_level = \"error\" in the file won over --log-level debug:\n%s", d.Logs())
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

func TestLogFormatJSON(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	for _, c := range []struct {
		name string
		opts harness.Options
	}{
		{"flag", harness.Options{Args: []string{"--log-format", "json"}}},
		{"config-file", harness.Options{ConfigTOML: "log_format = \"json\"\n"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := harness.StartDaemon(t, c.opts)
			d.Stop()
			lines := strings.Split(strings.TrimSpace(d.Logs()), "\n")
			for _, l := range lines {
				var rec map[string]any
				if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
					t.Errorf("not a JSON log record with level and msg: %q (%v)", l, err)
				}
			}
			if len(lines) < 2 {
				t.Errorf("only %d log lines", len(lines))
			}
			harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
		})
	}
}
