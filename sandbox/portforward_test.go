package sandbox

import (
	"errors"
	"net"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/store"
)

// TestPortForwardHostLoopbackOnlyForHostNetwork: a ready pod of its own
// network with no namespace pin (a record that lost it) is refused with
// FailedPrecondition, and never reaches a listener on the node's loopback;
// a host-network pod (which has no pin) is forwarded to the node's
// loopback.
func TestPortForwardHostLoopbackOnlyForHostNetwork(t *testing.T) {
	m := testManager(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := int32(l.Addr().(*net.TCPAddr).Port)
	accepted := make(chan struct{}, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close() // the forward's copy ends at its EOF
			accepted <- struct{}{}
		}
	}()

	ownNet := hostPodConfig("own-net")
	ownNet.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_POD
	for _, p := range []*store.Pod{
		{ID: "own-net", Config: ownNet, State: runtimeapi.PodSandboxState_SANDBOX_READY},
		{ID: "host-net", Config: hostPodConfig("host-net"), State: runtimeapi.PodSandboxState_SANDBOX_READY},
	} {
		if err := m.store.SavePod(p); err != nil {
			t.Fatal(err)
		}
	}

	client, server := net.Pipe()
	client.Close() // the forward ends at once: the connection is what counts
	err = m.PortForward(t.Context(), "own-net", port, server)
	if !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("forward to a pod of its own network without a pin: %v, want FailedPrecondition", err)
	}
	select {
	case <-accepted:
		t.Fatal("the forward to a pod of its own network reached the node's loopback")
	case <-time.After(200 * time.Millisecond):
	}

	client, server = net.Pipe()
	client.Close()
	if err := m.PortForward(t.Context(), "host-net", port, server); err != nil {
		t.Errorf("forward to a host-network pod: %v", err)
	}
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the forward to a host-network pod did not reach the node's loopback")
	}
}
