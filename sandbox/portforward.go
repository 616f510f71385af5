package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/podns"
)

// PortForward connects stream to TCP port on loopback inside the pod's
// network namespace (the host's only for a host-network pod) and copies
// both ways until the pod's side is done or ctx ends.
func (m *Manager) PortForward(ctx context.Context, podID string, port int32, stream io.ReadWriteCloser) error {
	pod, err := m.GetPod(podID)
	if err != nil {
		return err
	}
	if pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return errkind.Errorf(errkind.FailedPrecondition, "pod %s is not ready", pod.ID)
	}
	if port <= 0 || port > 65535 {
		return errkind.Errorf(errkind.Invalid, "port %d: must be 1 to 65535", port)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	var conn net.Conn
	dial := func() (err error) {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	}
	// The pod's config, not a missing pin, says which loopback: a pod of
	// its own network whose pin is gone must not reach the node's.
	pin := pod.Pins[string(podns.Net)]
	switch {
	case namespaceOptions(pod.Config).GetNetwork() == runtimeapi.NamespaceMode_NODE:
		err = dial()
	case pin == "":
		return errkind.Errorf(errkind.FailedPrecondition, "pod %s has no network namespace (not pinned): nothing to forward port %d to", pod.ID, port)
	default:
		err = podns.DoInNetNS(pin, dial)
	}
	if err != nil {
		return fmt.Errorf("port-forward to port %d in pod %s: %w", port, pod.ID, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	go func() {
		io.Copy(conn, stream)
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.CloseWrite() // the client is done sending; the server may still answer
		}
	}()
	_, err = io.Copy(stream, conn)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
