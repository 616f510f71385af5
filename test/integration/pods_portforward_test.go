package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// TestPodPortForward forwards local ports with kubectl's client library
// through the URL PortForward returns to an httpd listening on the pod's
// loopback only (so the pod's network namespace is what is reached), with
// two forwards at once and several requests each; a port nothing listens on
// fails that stream, not the server; unknown pods get NotFound.
func TestPodPortForward(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath}})
	cfg := e.podConfig("forward")
	pod := e.runPod(t, cfg)
	ctr := e.runContainer(t, pod, cfg, e.ctrConfig("httpd", "/bin/sh", "-c",
		"mkdir -p /tmp/www && echo hello from the pod > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www"))
	// A forward ends at its first failed connection (as kubectl's does), so
	// the httpd must listen first.
	if !eventually(10*time.Second, func() bool {
		// 0100007F:1F90 is 127.0.0.1:8080, state 0A is LISTEN.
		return e.exec(t, ctr, "/bin/grep", "-q", "0100007F:1F90 00000000:0000 0A", "/proc/net/tcp").code == 0
	}) {
		t.Fatal("the httpd in the pod does not answer")
	}
	fdsBefore := openFDs(t, e.d.PID())

	forward := func(t *testing.T, port int32) (uint16, func()) { return forwardPort(t, e, pod, port) }
	get := getLocal
	a, stopA := forward(t, 8080)
	if s, err := get(a); s != "hello from the pod\n" {
		t.Fatalf("through the forward: %q, %v; want the pod's index.html", s, err)
	}
	b, stopB := forward(t, 8080)
	errs := make(chan error, 10)
	for i := range 10 {
		port := a
		if i%2 == 1 {
			port = b
		}
		go func() {
			s, err := get(port)
			if err == nil && s != "hello from the pod\n" {
				err = fmt.Errorf("got %q", s)
			}
			errs <- err
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent request through two forwards: %v", err)
		}
	}
	stopA()
	stopB()

	// Nothing listens on 8081: the connection fails, the server carries on.
	c, stopC := forward(t, 8081)
	if s, err := get(c); err == nil {
		t.Errorf("request to a port nothing listens on gave %q", s)
	}
	stopC()

	_, err := e.d.Runtime.PortForward(t.Context(), &runtimeapi.PortForwardRequest{PodSandboxId: "nosuchpod", Port: []int32{80}})
	assertCode(t, err, one(codes.NotFound), "nosuchpod")
	_, err = e.d.Runtime.PortForward(t.Context(), &runtimeapi.PortForwardRequest{PodSandboxId: pod, Port: []int32{70000}})
	assertCode(t, err, one(codes.InvalidArgument), "70000")

	if !eventually(5*time.Second, func() bool { return openFDs(t, e.d.PID()) <= fdsBefore }) {
		t.Errorf("berthd holds %d fds after the forwards ended, %d before", openFDs(t, e.d.PID()), fdsBefore)
	}
}

// forwardPort forwards a free local port to port in pod with kubectl's
// client library and returns it and a function that stops the forward.
func forwardPort(t *testing.T, e *podEnv, pod string, port int32) (local uint16, stop func()) {
	t.Helper()
	resp, err := e.d.Runtime.PortForward(t.Context(), &runtimeapi.PortForwardRequest{PodSandboxId: pod, Port: []int32{port}})
	if err != nil {
		t.Fatalf("PortForward: %v", err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		t.Fatal(err)
	}
	rt, upgrader, err := spdy.RoundTripperFor(&restclient.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	stopCh, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stopCh, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("ForwardPorts: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("port-forward not ready after 10s")
	}
	ports, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	return ports[0].Local, func() { close(stopCh); <-done }
}

// getLocal fetches / from a local port.
func getLocal(local uint16) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", local))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestPodPortForwardHostNetwork forwards to a port on the host's loopback
// for a pod in the host's network namespace.
func TestPodPortForwardHostNetwork(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath}})
	cfg := e.podConfig("forward-host")
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}
	pod := e.runPod(t, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	e.runContainer(t, pod, cfg, e.ctrConfig("httpd", "/bin/sh", "-c",
		fmt.Sprintf("mkdir -p /tmp/www && echo hello from the host > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:%d -h /tmp/www", port)))
	if !eventually(10*time.Second, func() bool {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		t.Fatal("the httpd on the host's loopback does not answer")
	}
	local, stop := forwardPort(t, e, pod, int32(port))
	defer stop()
	if s, err := getLocal(local); s != "hello from the host\n" {
		t.Errorf("through the forward: %q, %v; want the host-network pod's index.html", s, err)
	}
}

// TestPodPortForwardStoppedPod: a pod of its own network that is stopped
// (its network namespace no longer its own to reach) is never forwarded to
// the node's loopback instead: a forward set up while it ran fails once it
// is stopped, a new one is refused with FailedPrecondition naming the pod,
// and a listener on the host's 127.0.0.1 at that port never sees a
// connection.
func TestPodPortForwardStoppedPod(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{Env: []string{harness.DefaultPath}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	port := int32(l.Addr().(*net.TCPAddr).Port)

	cfg := e.podConfig("forward-stopped")
	pod := e.runPod(t, cfg)
	local, stop := forwardPort(t, e, pod, port)
	if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if s, err := getLocal(local); err == nil {
		t.Errorf("a request through the forward to the stopped pod gave %q", s)
	}
	stop()
	_, err = e.d.Runtime.PortForward(t.Context(), &runtimeapi.PortForwardRequest{PodSandboxId: pod, Port: []int32{port}})
	assertCode(t, err, one(codes.FailedPrecondition), pod, "not ready")
	select {
	case <-accepted:
		t.Error("a forward to the stopped pod reached the host's loopback")
	case <-time.After(200 * time.Millisecond):
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
