package integration

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestImageVolumePendingMakesNothing: while an image volume's image is not
// pulled yet, the kubelet retries CreateContainer; each retry is refused
// NotFound naming the mount before berthd makes anything: no container
// record, lease, writable layer folder or rootfs mount comes and goes (no
// crash point of the create is reached, no layer folder is created).
func TestImageVolumePendingMakesNothing(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	points := filepath.Join(t.TempDir(), "points")
	e.d.RestartEnv("BERTH_CRASHPOINT_LOG=" + points)
	cfg := e.podConfig("imagevol-pending")
	pod := e.runPod(t, cfg)
	// The crash points the pod's start reached are not the create's.
	podPoints := len(readIfExists(t, points))
	layers := watchCreates(t, filepath.Join(e.d.Root, "containers"))

	cc := e.ctrConfig("pending", sleeper...)
	absent := e.reg.Host() + "/berth/pending:v1"
	cc.Mounts = []*runtimeapi.Mount{imageMount("/data", absent, "")}
	for range 3 { // as the kubelet's retries
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
		assertCode(t, err, one(codes.NotFound), "mount /data", absent, "pull it first")
	}
	if made := layers(); len(made) != 0 {
		t.Errorf("writable layer folders made for the refused creates: %v", made)
	}
	// Empty too where berthd is built without crash points (the VM tier):
	// the folders above still show a create that went too far.
	if got := readIfExists(t, points)[podPoints:]; got != "" {
		t.Errorf("steps the refused creates made and undid:\n%s\nwant none", got)
	}
	if m := mountsMentioning(pod + "/containers"); len(m) != 0 {
		t.Errorf("mounts of the refused container left: %v", m)
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// watchCreates watches dir for entries created in it and returns a function
// that answers the names created so far.
func watchCreates(t *testing.T, dir string) func() []string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE); err != nil {
		t.Fatalf("watch %s: %v", dir, err)
	}
	return func() []string {
		var names []string
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if err == unix.EAGAIN {
				return names
			}
			if err != nil {
				t.Fatalf("read inotify events of %s: %v", dir, err)
			}
			for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
				size := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
				names = append(names, strings.TrimRight(string(b[unix.SizeofInotifyEvent:size]), "\x00"))
				b = b[size:]
			}
		}
	}
}

// readIfExists is the content of the file at path, "" if there is none.
func readIfExists(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}
