package integration

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestLogFileRefusedPromptly: whoever can write the pod's log folder cannot
// hang the shim with a FIFO planted as a container's log (with or without a
// reader), nor make it write through a symlinked folder or into a folder:
// CreateContainer fails at once naming the log, the file outside is
// untouched, and a rotation's ReopenContainerLog is held to the same rules
// (issue #21, finding 8).
func TestLogFileRefusedPromptly(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	cfg := e.podConfig("logopen")
	pod := e.runPod(t, cfg)

	outside := t.TempDir()
	victim := filepath.Join(outside, "0.log")
	if err := os.WriteFile(victim, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	untouched := func() {
		t.Helper()
		if b, _ := os.ReadFile(victim); string(b) != "untouched" {
			t.Errorf("the file outside the log folder now holds %q", b)
		}
	}
	plant := func(rel string, make func(path string) error) string {
		t.Helper()
		path := filepath.Join(e.logs, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := make(path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fifo := func(p string) error { return syscall.Mkfifo(p, 0o600) }
	plant("fifo/0.log", fifo)
	read := plant("readfifo/0.log", fifo)
	// Someone reads it: a blocking open would then succeed.
	reader, err := os.OpenFile(read, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	plant("linkdir", func(p string) error { return os.Symlink(outside, p) })
	plant("folder/0.log", func(p string) error { return os.Mkdir(p, 0o755) })

	for _, c := range []struct{ logPath, why string }{
		{"fifo/0.log", "fifo"},
		{"readfifo/0.log", "fifo"},
		{"linkdir/0.log", "symlink"},
		{"folder/0.log", "directory"},
	} {
		cc := e.ctrConfig("planted-"+filepath.Dir(c.logPath), "/bin/echo", "written")
		cc.LogPath = c.logPath
		start := time.Now()
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("CreateContainer with %s took %v", c.logPath, took)
		}
		if err == nil || !strings.Contains(err.Error(), filepath.Join(e.logs, c.logPath)) ||
			!strings.Contains(strings.ToLower(err.Error()), c.why) {
			t.Errorf("CreateContainer with %s planted = %v; want an error naming the log and %q", c.logPath, err, c.why)
		}
	}
	untouched()
	reader.SetReadDeadline(time.Now().Add(time.Second)) // a writer may hold it open
	if b, _ := io.ReadAll(reader); len(b) > 0 {
		t.Errorf("the FIFO got %q", b)
	}

	// The log folder is fine: the container runs and logs.
	ok := e.ctrConfig("fine", sleeper...)
	ok.LogPath = "fine/0.log"
	ctr := e.runContainer(t, pod, cfg, ok)
	// Rotation: a symlink put where the renamed log was is not followed.
	log := filepath.Join(e.logs, "fine", "0.log")
	if err := os.Rename(log, log+".1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, log); err != nil {
		t.Fatal(err)
	}
	_, err = e.d.Runtime.ReopenContainerLog(t.Context(), &runtimeapi.ReopenContainerLogRequest{ContainerId: ctr})
	if err == nil || !strings.Contains(err.Error(), log) {
		t.Errorf("ReopenContainerLog onto a symlink = %v, want an error naming %s", err, log)
	}
	untouched()

	list, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
	if err != nil || len(list.Containers) != 1 {
		t.Errorf("containers after the refused creates: %v, %v; want only the fine one", list.GetContainers(), err)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
