// Command metered is TestCRIMetricsFigures' container: it holds as many
// OS threads as its argument says, besides its own, a listening socket on
// :8080 (connections accepted and closed), and spins on one more thread,
// so that its CPU quota throttles it. It is built on the host: the VM tier
// puts it on its disk (BERTH_METERED_BIN), since the VM has no Go.
package main

import (
	"net"
	"os"
	"runtime"
	"strconv"
)

func main() {
	threads, err := strconv.Atoi(os.Args[1])
	if err != nil {
		panic(err)
	}
	l, err := net.Listen("tcp", ":8080")
	if err != nil {
		panic(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err == nil {
				c.Close()
			}
		}
	}()
	for range threads {
		go func() {
			runtime.LockOSThread()
			select {}
		}()
	}
	for {
	}
}
