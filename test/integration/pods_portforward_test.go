package integration

import (
	"fmt"
	"io"
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
	e.runContainer(t, pod, cfg, e.ctrConfig("httpd", "/bin/sh", "-c",
		"mkdir -p /tmp/www && echo hello from the pod > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www"))
	fdsBefore := openFDs(t, e.d.PID())

	forward := func(t *testing.T, port int32) (local uint16, stop func()) {
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
	get := func(local uint16) (string, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", local))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}

	// The httpd may not listen yet right after the start.
	a, stopA := forward(t, 8080)
	if !eventually(10*time.Second, func() bool { s, _ := get(a); return s == "hello from the pod\n" }) {
		s, err := get(a)
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
