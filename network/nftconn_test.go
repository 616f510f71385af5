package network

import (
	"testing"

	"github.com/google/nftables"
)

// TestRestartRewritesTheGuardOfManyDualStackPods: berthd's start rewrites
// the guard table of every pod in one transaction; with 40 dual-stack pods
// (about 800 rules) it succeeds and each pod keeps its chain. On the
// sockets' default buffers the batch did not fit (EMSGSIZE, or ENOBUFS on
// the answers from about 150 rules), so a node with that many pods had no
// pod network after a berthd restart.
func TestRestartRewritesTheGuardOfManyDualStackPods(t *testing.T) {
	const pods = 40
	e := newEnv(t, 24, withSubnet6)
	for range pods {
		e.attach(t)
	}
	n2, err := New(e.cfg, e.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Setup(); err != nil {
		t.Fatalf("Setup after a restart with %d dual-stack pods: %v", pods, err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, ch := range chains {
		if ch.Table.Name == e.cfg.TableName {
			got++
		}
	}
	if got != pods {
		t.Errorf("guard table %s has %d chains after the restart, want %d (one per pod)", e.cfg.TableName, got, pods)
	}
}
