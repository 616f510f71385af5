package sandbox

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-runtime/berth/cri/errkind"
	"golang.org/x/sys/unix"
)

// logRoot is the folder the pod's log_directory is in (the kubelet's
// /var/log/pods). berthd makes, and the shim opens, a container's log
// beneath it with no symlink below it: whoever can write there (a log
// agent with the folder as a volume) cannot swap the pod's folder, or a
// folder of the log path, for a symlink that leads root's writes out of it.
// Symlinks above it are the node's admin's (/var/log on another disk).
func logRoot(logDir string) string { return filepath.Dir(filepath.Clean(logDir)) }

// makeLogFolder makes the folder of the container log logPath, which lies
// in the pod's log folder logDir, and the folders above it up to
// logRoot(logDir), as MkdirAll would, but refuses a symlink (or anything
// but a folder) at every step instead of following it.
func makeLogFolder(logDir, logPath string) error {
	root := logRoot(logDir)
	rel, err := filepath.Rel(root, filepath.Dir(logPath))
	if err != nil || !filepath.IsLocal(rel) {
		return errkind.Errorf(errkind.Invalid, "container log %s: not beneath the pod log root %s", logPath, root)
	}
	// Above the pod's folder, as MkdirAll did: that part is the admin's.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return errkind.PathErrorf(err, "container log %s: make the pod log root: %w", logPath, err)
	}
	dirfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errkind.PathErrorf(err, "container log %s: open the pod log root %s: %w", logPath, root, err)
	}
	for _, name := range strings.Split(rel, "/") {
		next, err := makeFolderBeneath(dirfd, name)
		unix.Close(dirfd)
		if err != nil {
			return logFolderError(logPath, root, err)
		}
		dirfd = next
	}
	unix.Close(dirfd)
	return nil
}

// makeFolderBeneath makes the folder name in dirfd unless it is there, and
// opens it; the open refuses a symlink (ELOOP) and a non-folder (ENOTDIR).
func makeFolderBeneath(dirfd int, name string) (int, error) {
	if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && err != unix.EEXIST {
		return -1, err
	}
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(dirfd, name, how)
		if err != unix.EINTR && err != unix.EAGAIN {
			return fd, err
		}
	}
}

// logFolderError names the log and what was wrong on its way. The node's
// log folder is not the caller's to mend: a symlink or a file planted there
// is a failed precondition, as a kernel without openat2 is.
func logFolderError(logPath, root string, err error) error {
	switch err {
	case unix.ELOOP:
		return errkind.Errorf(errkind.FailedPrecondition, "container log %s: a symlink in its path below %s is refused", logPath, root)
	case unix.ENOTDIR:
		return errkind.Errorf(errkind.FailedPrecondition, "container log %s: a folder in its path below %s is not a folder", logPath, root)
	case unix.ENOSYS:
		return errkind.Errorf(errkind.FailedPrecondition, "container log %s: the kernel has no openat2 (Linux 5.6 and later have it), which berth needs to make log folders safely", logPath)
	}
	return errkind.PathErrorf(err, "container log %s: make its folder: %w", logPath, err)
}
