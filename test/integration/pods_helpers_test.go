package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Helpers shared by the pods_*_test.go files, on top of pods_test.go's.

// sleeper is a command that runs until stopped.
var sleeper = []string{"/bin/sleep", "100000"}

// runContainer creates and starts a container and waits until it runs.
func (e *podEnv) runContainer(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) string {
	t.Helper()
	id := e.create(t, pod, podCfg, cfg)
	e.start(t, id)
	e.waitState(t, id, runtimeapi.ContainerState_CONTAINER_RUNNING)
	return id
}

func (e *podEnv) start(t *testing.T, id string) {
	t.Helper()
	if _, err := e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("StartContainer %s: %v", id, err)
	}
}

// runToExit creates and starts a container, waits until it has exited and
// returns its status and what it wrote to stdout.
func (e *podEnv) runToExit(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) (*runtimeapi.ContainerStatus, string) {
	t.Helper()
	id := e.create(t, pod, podCfg, cfg)
	e.start(t, id)
	st := e.waitState(t, id, runtimeapi.ContainerState_CONTAINER_EXITED)
	return st, logText(readLog(t, st.LogPath), "stdout")
}

// execResult is what ExecSync returned.
type execResult struct {
	stdout, stderr string
	code           int32
}

// exec runs cmd in a container with a 10 s timeout; an error fails t.
func (e *podEnv) exec(t *testing.T, id string, cmd ...string) execResult {
	t.Helper()
	return e.execWithin(t, id, 10, cmd...)
}

// execWithin is exec with a timeout of seconds, for commands that do more
// than look (under the VM tier's emulation, on a loaded machine, a shell
// loop of 300 applets took over 10 s).
func (e *podEnv) execWithin(t *testing.T, id string, seconds int64, cmd ...string) execResult {
	t.Helper()
	resp, err := e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: seconds},
		grpc.MaxCallRecvMsgSize(64<<20))
	if err != nil {
		t.Fatalf("ExecSync %q in %s: %v", cmd, id, err)
	}
	return execResult{string(resp.Stdout), string(resp.Stderr), resp.ExitCode}
}

// sh runs a shell script in a container and returns its stdout without the
// trailing newline; a non-zero exit fails t.
func (e *podEnv) sh(t *testing.T, id, script string) string {
	t.Helper()
	r := e.exec(t, id, "/bin/sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("sh -c %q in %s: exit %d, stdout %q, stderr %q", script, id, r.code, r.stdout, r.stderr)
	}
	return strings.TrimSuffix(r.stdout, "\n")
}

func (e *podEnv) podStatus(t *testing.T, pod string) *runtimeapi.PodSandboxStatus {
	t.Helper()
	resp, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", pod, err)
	}
	return resp.Status
}

// verbosePodInfo decodes the pod's verbose status info into v.
func (e *podEnv) verbosePodInfo(t *testing.T, pod string, v any) {
	t.Helper()
	resp, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", pod, err)
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), v); err != nil {
		t.Fatalf("pod %s verbose info: %v: %q", pod, err, resp.Info)
	}
}

// ctrPID is the host PID of a container's process (verbose status).
func (e *podEnv) ctrPID(t *testing.T, id string) int {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStatus(t.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil || info.Pid <= 0 {
		t.Fatalf("container %s verbose info has no pid (%v): %q", id, err, resp.Info["info"])
	}
	return info.Pid
}

// stop stops a container with the given timeout (seconds).
func (e *podEnv) stop(t *testing.T, id string, timeout int64) {
	t.Helper()
	if _, err := e.d.Runtime.StopContainer(t.Context(), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: timeout}); err != nil {
		t.Fatalf("StopContainer %s: %v", id, err)
	}
}

// listPodIDs lists the IDs of the pods that filter selects, and checks
// that StreamPodSandboxes streams the same.
func (e *podEnv) listPodIDs(t *testing.T, f *runtimeapi.PodSandboxFilter) []string {
	t.Helper()
	resp, err := e.d.Runtime.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{Filter: f})
	if err != nil {
		t.Fatalf("ListPodSandbox(%v): %v", f, err)
	}
	var ids []string
	for _, p := range resp.Items {
		ids = append(ids, p.Id)
	}
	stream, err := e.d.Runtime.StreamPodSandboxes(t.Context(), &runtimeapi.StreamPodSandboxesRequest{Filter: f})
	streamed := streamAll(t, stream, err, func(r *runtimeapi.StreamPodSandboxesResponse) (ids []string) {
		for _, p := range r.PodSandboxes {
			ids = append(ids, p.Id)
		}
		return ids
	})
	if !sameSet(streamed, ids) {
		t.Errorf("StreamPodSandboxes(%v) = %v, ListPodSandbox = %v", f, streamed, ids)
	}
	return ids
}

// listContainerIDs lists the IDs of the containers that filter selects,
// and checks that StreamContainers streams the same.
func (e *podEnv) listContainerIDs(t *testing.T, f *runtimeapi.ContainerFilter) []string {
	t.Helper()
	resp, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{Filter: f})
	if err != nil {
		t.Fatalf("ListContainers(%v): %v", f, err)
	}
	var ids []string
	for _, c := range resp.Containers {
		ids = append(ids, c.Id)
	}
	stream, err := e.d.Runtime.StreamContainers(t.Context(), &runtimeapi.StreamContainersRequest{Filter: f})
	streamed := streamAll(t, stream, err, func(r *runtimeapi.StreamContainersResponse) (ids []string) {
		for _, c := range r.Containers {
			ids = append(ids, c.Id)
		}
		return ids
	})
	if !sameSet(streamed, ids) {
		t.Errorf("StreamContainers(%v) = %v, ListContainers = %v", f, streamed, ids)
	}
	return ids
}

// streamAll reads a Stream* call to its end and returns the IDs of what
// each message carried.
func streamAll[R any](t *testing.T, stream grpc.ServerStreamingClient[R], err error, ids func(*R) []string) []string {
	t.Helper()
	var out []string
	for err == nil {
		var r *R
		if r, err = stream.Recv(); err == nil {
			out = append(out, ids(r)...)
		}
	}
	if !errors.Is(err, io.EOF) {
		t.Fatalf("stream: %v", err)
	}
	return out
}

// logRecord is one line of a CRI log file.
type logRecord struct {
	time   time.Time
	stream string // stdout, stderr
	tag    string // P, F
	text   string
}

var logLine = regexp.MustCompile(`^(\S+) (stdout|stderr) (P|F) (.*)$`)

// readLog parses a CRI log file; a line not in the CRI format, or a time
// that is not RFC 3339 with nanoseconds, fails t.
func readLog(t *testing.T, path string) []logRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("container log: %v", err)
	}
	defer f.Close()
	var recs []logRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := logLine.FindStringSubmatch(sc.Text())
		if m == nil {
			t.Fatalf("%s: line not in the CRI log format: %q", path, sc.Text())
		}
		ts, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("%s: bad time in %q: %v", path, sc.Text(), err)
		}
		recs = append(recs, logRecord{ts, m[2], m[3], m[4]})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return recs
}

// logText joins the records of one stream back into the text the
// container wrote: a P record continues the line, an F record ends it.
func logText(recs []logRecord, stream string) string {
	var b strings.Builder
	for _, r := range recs {
		if r.stream != stream {
			continue
		}
		b.WriteString(r.text)
		if r.tag == "F" {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// eventually polls cond for up to d (harness.Eventually).
func eventually(d time.Duration, cond func() bool) bool { return harness.Eventually(d, cond) }
