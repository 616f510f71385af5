package spec

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxRootFile caps what readRootFile reads: /etc/passwd and /etc/group are
// small; a huge one is a hostile image.
const maxRootFile = 4 << 20

// maxSymlinks is how many symlinks one lookup may follow (as Linux's 40).
const maxSymlinks = 40

// useOpenat2 can be turned off by tests to exercise the fallback resolver.
var useOpenat2 = true

// readRootFile reads the regular file at name (an absolute path as seen inside
// the container) from rootfs. Symlinks are resolved as if rootfs were "/":
// absolute targets start at rootfs and ".." stops at it, so nothing outside
// rootfs is ever opened. A missing file gives an error wrapping errNotFound.
func readRootFile(rootfs, name string) ([]byte, error) {
	f, err := openInRoot(rootfs, name, openFlags)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%s: %w", name, errNotFound)
		}
		return nil, fmt.Errorf("read %s from the image: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s from the image: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("read %s from the image: not a regular file", name)
	}
	if fi.Size() > maxRootFile {
		return nil, fmt.Errorf("read %s from the image: larger than %d bytes", name, maxRootFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRootFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s from the image: %w", name, err)
	}
	if len(data) > maxRootFile {
		return nil, fmt.Errorf("read %s from the image: larger than %d bytes", name, maxRootFile)
	}
	return data, nil
}

// openFlags never block (a FIFO planted as /etc/passwd) and never take a
// controlling terminal.
const openFlags = unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK

// openInRoot opens name (an absolute path as seen inside rootfs) with flags,
// resolving it as if rootfs were "/".
func openInRoot(rootfs, name string, flags int) (*os.File, error) {
	rel := strings.TrimLeft(path.Clean("/"+name), "/")
	if useOpenat2 {
		f, err := openat2InRoot(rootfs, rel, flags)
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			return f, err
		}
		// openat2 is missing (Linux < 5.6) or filtered by seccomp.
	}
	resolved, err := resolveInRoot(rootfs, rel)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(resolved, flags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: resolved, Err: err}
	}
	return os.NewFile(uintptr(fd), resolved), nil
}

// openat2InRoot lets the kernel do the scoped resolution (RESOLVE_IN_ROOT),
// which is also free of races with a rootfs that changes meanwhile.
func openat2InRoot(rootfs, rel string, flags int) (*os.File, error) {
	dirfd, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rootfs, Err: err}
	}
	defer unix.Close(dirfd)
	how := &unix.OpenHow{
		Flags:   uint64(flags),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(dirfd, rel, how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "openat2", Path: filepath.Join(rootfs, rel), Err: err}
		}
		return os.NewFile(uintptr(fd), filepath.Join(rootfs, rel)), nil
	}
}

// resolveInRoot resolves rel inside rootfs one component at a time with the
// same rules as RESOLVE_IN_ROOT, and returns a host path whose every
// component is a real (non-symlink) entry under rootfs.
func resolveInRoot(rootfs, rel string) (string, error) {
	cur := "/" // resolved so far, inside rootfs, free of symlinks
	remaining := rel
	links := 0
	for remaining != "" {
		var part string
		part, remaining, _ = strings.Cut(remaining, "/")
		switch part {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur) // cur has no symlinks: lexical is physical
			continue
		}
		next := path.Join(cur, part)
		host := filepath.Join(rootfs, next)
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxSymlinks {
			return "", &os.PathError{Op: "resolve", Path: filepath.Join(rootfs, rel), Err: unix.ELOOP}
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		remaining = target + "/" + remaining
	}
	return filepath.Join(rootfs, cur), nil
}
