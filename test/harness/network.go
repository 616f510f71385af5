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
	n := networkSeq.Add(1)
	bridge := fmt.Sprintf("bt%d-%d", os.Getpid()%10000, n)
	subnet := fmt.Sprintf("10.%d.%d.0/24", 200+os.Getpid()%50, n%256)
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(bridge); err == nil {
			netlink.LinkDel(link)
		}
		if c, err := nftables.New(); err == nil {
			for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyBridge} {
				c.DelTable(&nftables.Table{Name: bridge, Family: f})
				c.Flush() // fails when the daemon never made the table: nothing to remove
			}
		}
	})
	return fmt.Sprintf("\n[network]\nbridge = %q\nsubnet = %q\n", bridge, subnet)
}
