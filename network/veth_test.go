package network

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/google/nftables/expr"
)

// dropped is how many frames the pod's guard chain has dropped.
func (e *testEnv) dropped(t *testing.T, pod string) uint64 {
	t.Helper()
	var n uint64
	for _, r := range e.guardRules(t, pod) {
		for _, x := range r.Exprs {
			if c, ok := x.(*expr.Counter); ok {
				n += c.Packets
			}
		}
	}
	return n
}

// TestPodGuardedFromItsFirstFrame: the pod's guard chain is in place
// before its eth0 comes up, so the first frame the pod sends meets it. The
// first frame here is the kernel's own: the duplicate address probe of
// eth0's link-local address, sent the moment eth0 is up in a pod whose
// router_solicitation_delay is 0, with a nonce option the guard drops (ipv6.go).
func TestPodGuardedFromItsFirstFrame(t *testing.T) {
	e := newEnv(t, 24, withSubnet6)
	id, pin := e.newPod(t)
	// The pod's namespace is the test's: eth0 takes its default.
	err := podns.DoInNetNS(pin, func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/default/router_solicitation_delay", []byte("0"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Attach(context.Background(), PodInfo{ID: id}, pin, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for e.dropped(t, id) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the guard dropped nothing: the pod's first frame, its link-local address probe, left before its guard chain was there")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
