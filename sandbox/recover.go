package sandbox

import (
	"context"
	"errors"

	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// recover reconnects to the shims of the pods berthd had. A ready pod whose
// shim is gone (killed, or the machine rebooted and wiped the state folder)
// becomes NOTREADY, what is left running of its containers is killed and
// its namespace pins are released; its containers then report EXITED from
// their exit records. Half-created pods and containers
// are left to the kubelet's StopPodSandbox/RemovePodSandbox, which undo
// whatever exists of them.
func (m *Manager) recover() error {
	if err := podns.PrepareRoot(m.podsDir()); err != nil {
		return err
	}
	pods, err := m.ListPods()
	if err != nil {
		return err
	}
	ctx := context.Background()
	live := map[string]bool{} // pods that keep their network
	for _, pod := range pods {
		c, err := m.podShim(pod.ID)
		if err == nil {
			if _, err = c.Info(ctx); err != nil {
				m.forgetShim(pod.ID)
			}
		}
		if err == nil {
			m.log.Info("reconnected to pod shim", "pod", pod.ID)
			live[pod.ID] = pod.State == runtimeapi.PodSandboxState_SANDBOX_READY
			if live[pod.ID] && pod.PausePID > 0 {
				go m.watchPause(pod.ID, c)
			}
			continue
		}
		if !errors.Is(err, shim.ErrUnavailable) {
			return err
		}
		if pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			continue
		}
		m.log.Warn("pod shim is gone: pod is not ready", "pod", pod.ID, "err", err)
		if err := m.shimLost(pod); err != nil {
			return err
		}
	}
	// Leases, links and host port rules of pods that are gone or stopped.
	return m.opts.Network.Reconcile(ctx, live)
}
