package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
)

// stargzVersion is the stargz snapshotter test/stargz pins: the newest
// release whose containerd-stargz-grpc the module proxy serves (later ones
// keep it in module github.com/containerd/stargz-snapshotter/cmd, which it
// does not).
const stargzVersion = "v0.6.4"

// stargzPlugin is containerd's configuration of the stargz snapshotter at
// a socket as the snapshot plugin "stargz".
const stargzPlugin = `
[proxy_plugins.stargz]
  type = "snapshot"
  address = %q
`

// stargzConfig is the snapshotter's own configuration: it fetches the
// layers from the bench's loopback registry (a localhost address, which
// it would ask over HTTP anyway) over plain HTTP, and is otherwise as
// shipped: prefetch of the prioritised files and background fetch on.
const stargzConfig = `
[[resolver.host.%[1]q.mirrors]]
  host = %[1]q
  insecure = true
`

// startStargz runs the stargz snapshotter on a fresh folder, pulling from
// registryHost, and returns its socket once it listens. When the test ends
// (after containerd's cleanup) it is stopped by its PID, any FUSE mount it
// left detached and its folder removed.
func startStargz(t *testing.T, registryHost string) (socket string) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("the stargz snapshotter needs FUSE: %v", err)
	}
	bin := harness.PinnedProgram(t, "BERTH_STARGZ_BIN", "stargz", "github.com/containerd/stargz-snapshotter/cmd/containerd-stargz-grpc")
	dir, err := os.MkdirTemp("", "bench-stargz-")
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(stargzConfig, registryHost)), 0o600); err != nil {
		t.Fatal(err)
	}
	logs, err := os.Create(filepath.Join(dir, "stargz.log"))
	if err != nil {
		t.Fatal(err)
	}
	socket = filepath.Join(dir, "stargz.sock")
	cmd := exec.Command(bin, "--root", filepath.Join(dir, "root"), "--address", socket, "--config", config)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// On SIGINT (not SIGTERM) it unmounts its FUSE mounts itself.
		stopProcess(cmd, syscall.SIGINT)
		logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("containerd-stargz-grpc log:\n%s", tail(string(b), 40))
		}
		unmountUnder(dir)
		os.RemoveAll(dir)
	})
	waitFor(t, 30*time.Second, "containerd-stargz-grpc socket", func() bool {
		_, err := os.Stat(socket)
		return err == nil
	})
	return socket
}
