package soak

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
	"github.com/gorilla/websocket"
)

// callTimeout bounds every CRI call and every stream of the soak.
const callTimeout = 2 * time.Minute

// soakEnv is one berthd with the busybox test image pulled, and the pod
// settings the soak's pods share.
type soakEnv struct {
	d      *harness.Daemon
	image  string
	logs   string  // the pods' log directories are made below it
	parent string  // cgroup parent of the pods
	ports  []int32 // a free host port per cycle slot, for the pods that map one
	tally  tally
}

// outcome is how a cycle's container ends, and what berth must report.
type outcome int

const (
	stopped  outcome = iota // runs until the test stops it
	exits                   // exit 0: Completed
	fails                   // exit 1: Error
	crashes                 // killed by SIGSEGV: 139, Error
	oomKills                // over its memory limit: 137, OOMKilled
)

// outcomeOf spreads the outcomes over the cycles: one in ten is OOM-killed,
// one crashes, one fails, two exit, the rest run until stopped.
func outcomeOf(cycle int) outcome {
	switch cycle % 10 {
	case 1, 5:
		return exits
	case 3:
		return crashes
	case 6:
		return fails
	case 9:
		return oomKills
	}
	return stopped
}

func (o outcome) String() string {
	return [...]string{"stopped", "exits", "fails", "crashes", "oom-killed"}[o]
}

// want is the exit code and reason ContainerStatus must report.
func (o outcome) want() (int32, string) {
	switch o {
	case exits:
		return 0, "Completed"
	case fails:
		return 1, "Error"
	case crashes:
		return 139, "Error"
	default:
		return 137, "OOMKilled"
	}
}

// podConfig is a pod of the soak: its own log directory, a cgroup below the
// env's parent, and (every fourth cycle) a host port mapping, so that the
// nftables maps churn too.
func (e *soakEnv) podConfig(name string, slot, cycle int) *runtimeapi.PodSandboxConfig {
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "soak", Uid: "uid-" + name},
		Hostname:     name,
		LogDirectory: filepath.Join(e.logs, name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/" + e.parent + "/pod-" + name},
	}
	if cycle >= 0 && cycle%4 == 0 {
		cfg.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 8080, HostPort: e.ports[slot]}}
	}
	// Each container in a PID namespace of its own, as the kubelet asks
	// unless a pod shares one (the CRI's zero value is POD). A crashing
	// container shares its pod's: it is not PID 1 there (PID 1 ignores
	// the signals it sends itself), so SIGSEGV kills it; and the pod's
	// berth-pause churns too.
	pid := runtimeapi.NamespaceMode_CONTAINER
	if cycle >= 0 && outcomeOf(cycle) == crashes {
		pid = runtimeapi.NamespaceMode_POD
	}
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Pid: pid}}
	return cfg
}

func (e *soakEnv) ctrConfig(name string, cmd ...string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: e.image},
		Command:  cmd,
		LogPath:  name + ".log",
	}
}

// cycleContainer is the container a cycle runs for outcome o.
func (e *soakEnv) cycleContainer(o outcome) *runtimeapi.ContainerConfig {
	switch o {
	case exits:
		return e.ctrConfig("work", "sh", "-c", "echo done")
	case fails:
		return e.ctrConfig("work", "sh", "-c", "echo failing >&2; exit 1")
	case crashes:
		return e.ctrConfig("work", "sh", "-c", "kill -SEGV $$")
	case oomKills:
		// The shell keeps the whole command substitution in memory.
		c := e.ctrConfig("work", "sh", "-c", "x=$(head -c 67108864 /dev/zero | tr '\\0' a)")
		c.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}}
		return c
	}
	return e.ctrConfig("work", "sleep", "100000")
}

// cycle runs one pod through its life as the kubelet would: run, create and
// start its container, see it end as o says (or stop it), stop and remove
// the pod, then remove its log directory (the kubelet's job, not the
// runtime's).
func (e *soakEnv) cycle(ctx context.Context, prefix string, slot, n int) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	defer e.tally.time("pod cycle", time.Now())
	o := outcomeOf(n)
	name := fmt.Sprintf("%schurn-%d", prefix, n)
	cfg := e.podConfig(name, slot, n)
	rt := e.d.Runtime
	run, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return fmt.Errorf("cycle %d (%s): RunPodSandbox: %w", n, o, err)
	}
	pod := run.PodSandboxId
	if err := e.runCycleContainer(ctx, pod, cfg, o, n); err != nil {
		return fmt.Errorf("cycle %d (%s), pod %s: %w", n, o, pod, err)
	}
	if err := e.tally.shim(e.shimPID(pod)); err != nil {
		return fmt.Errorf("cycle %d: %w", n, err)
	}
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		return fmt.Errorf("cycle %d: StopPodSandbox %s: %w", n, pod, err)
	}
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		return fmt.Errorf("cycle %d: RemovePodSandbox %s: %w", n, pod, err)
	}
	return os.RemoveAll(cfg.LogDirectory)
}

func (e *soakEnv) runCycleContainer(ctx context.Context, pod string, cfg *runtimeapi.PodSandboxConfig, o outcome, n int) error {
	rt := e.d.Runtime
	created, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: pod, SandboxConfig: cfg, Config: e.cycleContainer(o)})
	if err != nil {
		return fmt.Errorf("CreateContainer: %w", err)
	}
	id := created.ContainerId
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		return fmt.Errorf("StartContainer: %w", err)
	}
	if o == stopped {
		if _, err := waitState(ctx, rt, id, runtimeapi.ContainerState_CONTAINER_RUNNING); err != nil {
			return err
		}
		// Half are stopped on their own first, half with their pod.
		if n%2 == 0 {
			_, err = rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0})
		}
		return err
	}
	st, err := waitState(ctx, rt, id, runtimeapi.ContainerState_CONTAINER_EXITED)
	if err != nil {
		return err
	}
	if code, reason := o.want(); st.ExitCode != code || st.Reason != reason {
		return fmt.Errorf("container ended with %d %q, want %d %q", st.ExitCode, st.Reason, code, reason)
	}
	return nil
}

// waitState polls a container's status until it is in state.
func waitState(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string, state runtimeapi.ContainerState) (*runtimeapi.ContainerStatus, error) {
	for {
		resp, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return nil, fmt.Errorf("ContainerStatus: %w", err)
		}
		if resp.Status.State == state {
			return resp.Status, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("container %s is %s, want %s: %w", id, resp.Status.State, state, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// resident is the long-lived pod the execs and attaches go into: a sleeper
// to exec in and a ticker that writes a line every 200 ms to attach to.
type resident struct {
	pod, sleeper, ticker string
}

func (e *soakEnv) startResident(ctx context.Context) (resident, error) {
	cfg := e.podConfig("resident", 0, -1)
	rt := e.d.Runtime
	run, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return resident{}, fmt.Errorf("RunPodSandbox resident: %w", err)
	}
	r := resident{pod: run.PodSandboxId}
	for _, c := range []struct {
		id  *string
		cfg *runtimeapi.ContainerConfig
	}{
		{&r.sleeper, e.ctrConfig("sleeper", "sleep", "100000")},
		{&r.ticker, e.ctrConfig("ticker", "sh", "-c", "while :; do echo tick; sleep 0.2; done")},
	} {
		created, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: r.pod, SandboxConfig: cfg, Config: c.cfg})
		if err != nil {
			return r, fmt.Errorf("CreateContainer %s: %w", c.cfg.Metadata.Name, err)
		}
		*c.id = created.ContainerId
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: *c.id}); err != nil {
			return r, fmt.Errorf("StartContainer %s: %w", c.cfg.Metadata.Name, err)
		}
		if _, err := waitState(ctx, rt, *c.id, runtimeapi.ContainerState_CONTAINER_RUNNING); err != nil {
			return r, err
		}
	}
	return r, nil
}

// execSync runs echo in the resident sleeper and checks what it printed.
func (e *soakEnv) execSync(ctx context.Context, r resident, n int) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	defer e.tally.time("ExecSync", time.Now())
	want := fmt.Sprintf("sync-%d", n)
	resp, err := e.d.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: r.sleeper, Cmd: []string{"echo", want}, Timeout: 30})
	if err != nil {
		return fmt.Errorf("ExecSync %d: %w", n, err)
	}
	if resp.ExitCode != 0 || string(resp.Stdout) != want+"\n" {
		return fmt.Errorf("ExecSync %d: exit %d, stdout %q, stderr %q; want 0 and %q", n, resp.ExitCode, resp.Stdout, resp.Stderr, want+"\n")
	}
	return nil
}

// streamExec runs echo in the resident sleeper over the streaming server
// and checks its output: over SPDY with kubectl's client library, or (odd
// n) over WebSocket with the v4 protocol a runtime's streaming server
// speaks, by hand.
func (e *soakEnv) streamExec(ctx context.Context, r resident, n int) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	defer e.tally.time("exec "+protocol(n), time.Now())
	want := fmt.Sprintf("stream-%d", n)
	resp, err := e.d.Runtime.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: r.sleeper, Cmd: []string{"echo", want}, Stdout: true})
	if err != nil {
		return fmt.Errorf("Exec %d: %w", n, err)
	}
	var out []byte
	if n%2 == 1 {
		var status string
		out, status, err = webSocketStream(ctx, resp.Url, func(_ []byte, status string) bool { return status != "" })
		if err == nil && !strings.Contains(status, "Success") {
			err = fmt.Errorf("status %q, want Success", status)
		}
	} else {
		out, err = execSPDY(ctx, resp.Url)
	}
	if err != nil {
		return fmt.Errorf("exec %d: %w", n, err)
	}
	if string(out) != want+"\n" {
		return fmt.Errorf("exec %d: stdout %q, want %q", n, out, want+"\n")
	}
	return nil
}

// protocol is the streaming protocol the n-th exec or attach speaks.
func protocol(n int) string {
	if n%2 == 1 {
		return "WebSocket"
	}
	return "SPDY"
}

func execSPDY(ctx context.Context, execURL string) ([]byte, error) {
	u, err := url.Parse(execURL)
	if err != nil {
		return nil, err
	}
	ex, err := remotecommand.NewSPDYExecutor(&restclient.Config{}, http.MethodPost, u)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out})
	return out.Bytes(), err
}

// streamAttach attaches to the resident ticker until it has shown a tick,
// then hangs up, as a user who ends kubectl attach does: over SPDY or
// WebSocket, as streamExec (by hand: client-go logs an error for every
// WebSocket stream its caller ends).
func (e *soakEnv) streamAttach(ctx context.Context, r resident, n int) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	defer e.tally.time("attach "+protocol(n), time.Now())
	resp, err := e.d.Runtime.Attach(ctx, &runtimeapi.AttachRequest{ContainerId: r.ticker, Stdout: true})
	if err != nil {
		return fmt.Errorf("Attach %d: %w", n, err)
	}
	if n%2 == 1 {
		_, _, err = webSocketStream(ctx, resp.Url, func(stdout []byte, _ string) bool { return bytes.Contains(stdout, []byte("tick\n")) })
	} else {
		err = attachSPDY(ctx, resp.Url)
	}
	if err != nil {
		return fmt.Errorf("attach %d: %w", n, err)
	}
	return nil
}

func attachSPDY(ctx context.Context, attachURL string) error {
	u, err := url.Parse(attachURL)
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewSPDYExecutor(&restclient.Config{}, http.MethodPost, u)
	if err != nil {
		return err
	}
	out := &tickWatch{seen: make(chan struct{})}
	ended := make(chan error, 1)
	streamCtx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	go func() { ended <- ex.StreamWithContext(streamCtx, remotecommand.StreamOptions{Stdout: out}) }()
	select {
	case <-out.seen:
		hangUp()
		<-ended
		return nil
	case err := <-ended:
		return fmt.Errorf("ended before a tick: %v", err)
	}
}

// webSocketStream reads a stream's messages (each starts with its channel:
// 1 stdout, 3 the status) until done says so, then closes the connection.
func webSocketStream(ctx context.Context, streamURL string, done func(stdout []byte, status string) bool) (stdout []byte, status string, err error) {
	dialer := websocket.Dialer{Subprotocols: []string{"v4.channel.k8s.io"}}
	conn, resp, err := dialer.DialContext(ctx, "ws"+strings.TrimPrefix(streamURL, "http"), nil)
	if err != nil {
		return nil, "", fmt.Errorf("websocket dial: %w", err)
	}
	resp.Body.Close()
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(deadline)
	}
	for !done(stdout, status) {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			return stdout, status, fmt.Errorf("stream ended early (stdout %q, status %q): %w", stdout, status, err)
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case 1:
			stdout = append(stdout, msg[1:]...)
		case 3:
			status += string(msg[1:])
		}
	}
	return stdout, status, nil
}

// tickWatch closes seen once "tick" has been written to it.
type tickWatch struct {
	buf  bytes.Buffer
	seen chan struct{}
}

func (w *tickWatch) Write(p []byte) (int, error) {
	if w.buf.Len() < 64 {
		w.buf.Write(p)
		if bytes.Contains(w.buf.Bytes(), []byte("tick\n")) {
			close(w.seen)
			w.buf.WriteString(strings.Repeat(".", 64)) // so that it closes once
		}
	}
	return len(p), nil
}

// freePorts picks n host ports that are free now.
func freePorts(n int) ([]int32, error) {
	var ports []int32
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		ports = append(ports, int32(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}
