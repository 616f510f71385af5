package kubelet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/exec"
)

// ---- 7: kubectl exec, attach and port-forward, through the kubelet ----

// streams does what kubectl exec, attach and port-forward do once the API
// server has sent them to the node: it talks SPDY to the kubelet's own
// server, which asks berth for a streaming URL and proxies to it.
func (e *env) streams(t *testing.T) {
	p := e.waitPod(t, "web", startTimeout, "Running with both containers ready", running)
	cfg := &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", e.port),
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}} // the kubelet's self-signed serving certificate
	base := fmt.Sprintf("/%s/%s", p.Namespace, p.Name)

	// kubectl exec web -c httpd -- sh -c '…; exit 3'
	q := url.Values{"container": {"httpd"}, "output": {"1"}, "error": {"1"},
		"command": {"sh", "-c", "echo out; echo err >&2; exit 3"}}
	var stdout, stderr bytes.Buffer
	err := e.stream(t, cfg, "/exec"+base+"/httpd", q, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	var exit exec.ExitError
	if !errors.As(err, &exit) || exit.ExitStatus() != 3 || stdout.String() != "out\n" || stderr.String() != "err\n" {
		t.Errorf("exec through the kubelet: err %v, stdout %q, stderr %q; want exit 3, out, err", err, stdout.String(), stderr.String())
	}

	// kubectl attach web -c logger: its live output, until we hang up.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ticks := &lineWaiter{want: "tick", found: make(chan struct{})}
	attach := url.Values{"container": {"logger"}, "output": {"1"}, "error": {"1"}}
	go func() {
		<-ticks.found
		cancel()
	}()
	err = e.streamContext(ctx, cfg, "/attach"+base+"/logger", attach, remotecommand.StreamOptions{Stdout: ticks, Stderr: io.Discard})
	select {
	case <-ticks.found:
	default:
		t.Errorf("attach through the kubelet saw no tick of the logger: %v", err)
	}

	// kubectl port-forward web :8080
	e.portForward(t, cfg, "/portForward"+base)
}

func (e *env) stream(t *testing.T, cfg *rest.Config, path string, q url.Values, opts remotecommand.StreamOptions) error {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return e.streamContext(ctx, cfg, path, q, opts)
}

func (e *env) streamContext(ctx context.Context, cfg *rest.Config, path string, q url.Values, opts remotecommand.StreamOptions) error {
	u := &url.URL{Scheme: "https", Host: strings.TrimPrefix(cfg.Host, "https://"), Path: path, RawQuery: q.Encode()}
	ex, err := remotecommand.NewSPDYExecutor(cfg, http.MethodPost, u)
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, opts)
}

// portForward forwards a free local port to the pod's 8080 through the
// kubelet and fetches the page the httpd serves.
func (e *env) portForward(t *testing.T, cfg *rest.Config, path string) {
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := &url.URL{Scheme: "https", Host: strings.TrimPrefix(cfg.Host, "https://"), Path: path}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	local := kubeenv.FreePort(t)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("%d:8080", local)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	defer func() {
		close(stop)
		<-done
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("port-forward through the kubelet: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("port-forward through the kubelet: not ready within 30 s")
	}
	body, err := kubeenv.Get(fmt.Sprintf("http://%s/", net.JoinHostPort("127.0.0.1", fmt.Sprint(local))))
	if err != nil || body != "hello from berth\n" {
		t.Errorf("GET through port-forward = %q, %v; want the httpd's page", body, err)
	}
}

// lineWaiter closes found when what was written contains want.
type lineWaiter struct {
	want  string
	buf   bytes.Buffer
	found chan struct{}
	done  bool
}

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.found)
	}
	return len(p), nil
}
