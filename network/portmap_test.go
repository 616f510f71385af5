package network

import (
	"testing"
	"time"

	"github.com/google/nftables"
)

// tableEvents collects the nftables table events of the tables named name
// while f runs.
func tableEvents(t *testing.T, name string, f func()) []*nftables.MonitorEvent {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	mon := nftables.NewMonitor(nftables.WithMonitorObject(nftables.MonitorObjectTables), nftables.WithMonitorEventBuffer(1024))
	events, err := c.AddMonitor(mon)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	f()
	// A table of the test's own, made and deleted last: once its events
	// are in, so are f's (one socket, in order).
	marker := &nftables.Table{Name: name + "m", Family: nftables.TableFamilyINet}
	c.AddTable(marker)
	c.DelTable(marker)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []*nftables.MonitorEvent
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("nftables monitor closed")
			}
			tb, _ := ev.Data.(*nftables.Table)
			switch {
			case tb == nil:
			case tb.Name == marker.Name && ev.Type == nftables.MonitorEventTypeDelTable:
				return got
			case tb.Name == name:
				got = append(got, ev)
			}
		case <-timeout:
			t.Fatal("the marker table's events did not come")
		}
	}
}

// TestIPv4OnlyStartLeavesIP6Alone: the start of an IPv4-only network
// neither adds nor deletes an ip6 table, unless one is left from an IPv6
// subnet before: that one it deletes.
func TestIPv4OnlyStartLeavesIP6Alone(t *testing.T) {
	e := newEnv(t, 24)
	ip6 := func(evs []*nftables.MonitorEvent) (n int) {
		for _, ev := range evs {
			if ev.Data.(*nftables.Table).Family == nftables.TableFamilyIPv6 {
				n++
			}
		}
		return n
	}
	evs := tableEvents(t, e.cfg.TableName, func() {
		for range 2 { // a start and a restart
			if err := e.Setup(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if n := ip6(evs); n != 0 {
		t.Errorf("%d ip6 table events at the starts of an IPv4-only network, want none", n)
	}

	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.AddTable(e.table(ipv6)) // as an IPv6 subnet before left it
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListTableOfFamily(e.cfg.TableName, nftables.TableFamilyIPv6); err == nil {
		t.Error("the ip6 table of a former IPv6 subnet is still there")
	}
}
