package shim

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxSunPath leaves room for the NUL in sockaddr_un.sun_path (108 bytes).
const maxSunPath = 100

// SocketPath is the shim's API socket in podDir.
func SocketPath(podDir string) string { return filepath.Join(podDir, SocketFile) }

// withShortPath calls fn with a path for podDir/name that fits in a
// sockaddr_un: deep pod folders (tests, custom state roots) go through
// /proc/self/fd of an O_PATH handle on the folder.
func withShortPath(podDir, name string, fn func(string) error) error {
	p := filepath.Join(podDir, name)
	if len(p) <= maxSunPath {
		return fn(p)
	}
	fd, err := unix.Open(podDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: podDir, Err: err}
	}
	defer unix.Close(fd)
	return fn("/proc/self/fd/" + strconv.Itoa(fd) + "/" + name)
}

// Listen creates the API socket, mode 0600, replacing a stale one. The
// caller removes the file when done (Close does not: the path it was bound
// with may have been a /proc/self/fd alias).
func Listen(podDir string) (*net.UnixListener, error) {
	return listenIn(podDir, SocketFile, "unix")
}

// ListenStream creates the stream socket (see stream.go) as Listen does.
func ListenStream(podDir string) (*net.UnixListener, error) {
	return listenIn(podDir, StreamFile, "unixpacket")
}

func listenIn(podDir, name, network string) (*net.UnixListener, error) {
	os.Remove(filepath.Join(podDir, name))
	var l *net.UnixListener
	err := withShortPath(podDir, name, func(p string) error {
		// umask rather than a chmod afterwards: no window with a wider mode.
		old := syscall.Umask(0o177)
		defer syscall.Umask(old)
		var err error
		l, err = net.ListenUnix(network, &net.UnixAddr{Name: p, Net: network})
		return err
	})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	return l, nil
}

func dialSocket(podDir string) (net.Conn, error) {
	return dialIn(podDir, SocketFile, "unix")
}

func dialStream(podDir string) (*net.UnixConn, error) {
	return dialIn(podDir, StreamFile, "unixpacket")
}

func dialIn(podDir, name, network string) (*net.UnixConn, error) {
	var c *net.UnixConn
	err := withShortPath(podDir, name, func(p string) error {
		var err error
		c, err = net.DialUnix(network, nil, &net.UnixAddr{Name: p, Net: network})
		return err
	})
	return c, err
}
