package network

import (
	"fmt"
	"strings"
	"testing"
)

// TestAddressRoundRobinSurvivesRestart: a freed address is handed out
// again only after the rest of the subnet, also by a restarted berthd
// (the allocator resumes after the last address it reserved, kept on disk;
// the highest address in use would hand out the freed one).
func TestAddressRoundRobinSurvivesRestart(t *testing.T) {
	e := newEnv(t, 24)
	base := strings.TrimSuffix(e.subnets[0].Addr().String(), "0")
	_, _, a := e.attach(t)
	idB, _, b := e.attach(t)
	if a.IP.String() != base+"2" || b.IP.String() != base+"3" {
		t.Fatalf("first pods got %s, %s; want %s2, %s3", a.IP, b.IP, base, base)
	}
	if err := e.Detach(bg, PodInfo{ID: idB}, ""); err != nil {
		t.Fatal(err)
	}
	n2, err := New(e.cfg, e.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Setup(); err != nil {
		t.Fatal(err)
	}
	id, pin := e.newPod(t)
	c, err := n2.Attach(bg, PodInfo{ID: id}, pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint(base, 4); c.IP.String() != want {
		t.Errorf("pod after restart got %s, want %s (not the freed %s)", c.IP, want, b.IP)
	}
}
