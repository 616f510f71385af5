package harness

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

var networkSeq atomic.Uint32

// testNetworkTOML gives one test daemon a pod network of its own (bridge,
// nftables table and /24 subnet), so that daemons running in parallel never
// share one, and removes it when the test ends.
func testNetworkTOML(t testing.TB) string {
	bridge, subnet := TestNetwork(t)
	return fmt.Sprintf("\n[network]\nbridge = %q\nsubnet = %q\n", bridge, subnet)
}

// TestNetwork names a bridge (and nftables tables) and a /24 subnet no other
// test daemon uses, and removes the bridge and tables when the test ends; for
// tests that write their own [network] table.
func TestNetwork(t testing.TB) (bridge, subnet string) {
	n := networkSeq.Add(1)
	bridge = fmt.Sprintf("bt%d-%d", os.Getpid()%10000, n)
	subnet = fmt.Sprintf("10.%d.%d.0/24", 200+os.Getpid()%50, n%256)
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(bridge); err == nil {
			netlink.LinkDel(link)
		}
		// berthd keeps its tables when it stops (its pods' rules outlive
		// it); the ip and ip6 tables and the netdev one (the pods' guard) go with
		// the test.
		for _, family := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyNetdev} {
			if c, err := nftables.New(); err == nil {
				c.DelTable(&nftables.Table{Name: bridge, Family: family})
				c.Flush() // fails when the daemon never made the table: nothing to remove
			}
		}
	})
	return bridge, subnet
}
