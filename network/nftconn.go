package network

import (
	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
)

// batchBuffer is the size of an nftables transaction's socket buffers:
// 16 MiB (the kernel doubles it) holds the guard table of 250 dual-stack
// pods. Memory is charged only for what a transaction queues.
const batchBuffer = 16 << 20

// newBatchConn is an nftables connection for a transaction of any size.
// google/nftables sends a whole batch in one sendmsg and reads the kernel's
// answers (an echo and an ack for each rule) only after it, so the socket's
// buffers must hold all of them; the defaults (net.core.wmem_default and
// rmem_default, 208 KiB on most hosts) hold a few hundred rules, which a
// node of tens of pods passes (a dual-stack pod's guard chain has about 20
// rules): rewriting the tables at start then failed with EMSGSIZE or
// ENOBUFS, and berthd had no pod network. As root, Set*Buffer uses
// SO_SNDBUFFORCE and SO_RCVBUFFORCE, which net.core.*mem_max do not cap.
func newBatchConn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(c *mdnetlink.Conn) error {
		if err := c.SetWriteBuffer(batchBuffer); err != nil {
			return err
		}
		return c.SetReadBuffer(batchBuffer)
	}))
}
