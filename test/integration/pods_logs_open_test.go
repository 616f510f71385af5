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
	"google.golang.org/grpc/codes"
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

// TestLogFolderSymlinkRefused: whoever can write the kubelet's pod log
// root cannot swap a pod's log folder, or a folder of a container's log
// path, for a symlink that leads berthd's folder making or the shim's log
// out of it: CreateContainer fails at once naming the log, and nothing is
// made or written outside (#34, finding 9: both followed the symlink).
func TestLogFolderSymlinkRefused(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	root, outside := t.TempDir(), t.TempDir()

	// The pod's own log folder is the symlink.
	swapped := e.podConfig("logfolder-swapped")
	swapped.LogDirectory = filepath.Join(root, "default_logfolder-swapped_uid")
	if err := os.Symlink(outside, swapped.LogDirectory); err != nil {
		t.Fatal(err)
	}
	// A folder of the log path is.
	planted := e.podConfig("logfolder-planted")
	planted.LogDirectory = filepath.Join(root, "default_logfolder-planted_uid")
	if err := os.Mkdir(planted.LogDirectory, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(planted.LogDirectory, "app")); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		cfg     *runtimeapi.PodSandboxConfig
		logPath string
	}{
		{swapped, "app/0.log"},
		{planted, "app/sub/0.log"},
	} {
		pod := e.runPod(t, c.cfg)
		cc := e.ctrConfig("app", "/bin/echo", "written")
		cc.LogPath = c.logPath
		start := time.Now()
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: c.cfg, Config: cc})
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("CreateContainer with %s took %v", c.logPath, took)
		}
		assertCode(t, err, one(codes.FailedPrecondition), filepath.Join(c.cfg.LogDirectory, c.logPath), "symlink")
		if left, _ := os.ReadDir(outside); len(left) > 0 {
			t.Errorf("after CreateContainer with %s, the folder outside the log root holds %v", filepath.Join(c.cfg.LogDirectory, c.logPath), left)
		}
		list, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{
			Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
		if err != nil || len(list.Containers) != 0 {
			t.Errorf("containers after the refused create: %v, %v; want none", list.GetContainers(), err)
		}
		e.removePod(t, pod)
	}

	// A log folder of real folders still takes a log, made as deep as the
	// path asks.
	fine := e.podConfig("logfolder-fine")
	fine.LogDirectory = filepath.Join(root, "default_logfolder-fine_uid")
	pod := e.runPod(t, fine)
	cc := e.ctrConfig("app", "/bin/echo", "written")
	cc.LogPath = "app/deeper/0.log"
	if st, text := e.runToExit(t, pod, fine, cc); st.ExitCode != 0 || !strings.Contains(text, "written") ||
		st.LogPath != filepath.Join(fine.LogDirectory, cc.LogPath) {
		t.Errorf("the container exited %d, logging %q to %s; want 0, its output, in %s", st.ExitCode, text, st.LogPath, filepath.Join(fine.LogDirectory, cc.LogPath))
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
