package stats

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/sandbox/store"
)

// ContainerDetails are what the CRI metrics report of a running container,
// cadvisor's series: its cgroup's figures and limits, its processes' open
// files and sockets, and its writable layer and the filesystem it is on.
type ContainerDetails struct {
	cgroups.Details
	// FileDescriptors and Sockets are the open files of the container's
	// processes, and those of them that are sockets (/proc/<pid>/fd).
	FileDescriptors, Sockets uint64
	// The writable layer's figures (see layerUsages), and its filesystem.
	LayerBytes, LayerInodes uint64
	Fs                      Filesystem
}

// Filesystem is the filesystem a writable layer is on: its device as
// cadvisor labels it (the mount's source), its size, and its free inodes.
type Filesystem struct {
	Device                 string
	LimitBytes, InodesFree uint64
}

// ContainerDetails reads a container's figures for the CRI metrics: its
// cgroup in one pass, then /proc for its processes' descriptors, and one
// statfs. They are read on request, not sampled by the collector: the
// metrics are asked for every few seconds at most, and most of these
// figures nobody else wants. A container without a cgroup (not started, or
// gone) has none: ok is false.
func (s *Collector) ContainerDetails(c *store.Container) (d ContainerDetails, ok bool, err error) {
	pod, err := s.opts.Store.Pod(c.PodID)
	if err != nil {
		return d, false, err
	}
	d.Details, err = s.opts.Cgroups.Details(s.opts.Cgroups.ContainerCgroupsPath(pod.Cgroup, c.ID))
	if errors.Is(err, fs.ErrNotExist) {
		return d, false, nil
	}
	if err != nil {
		return d, false, err
	}
	d.FileDescriptors, d.Sockets = countFDs(d.Procs)
	d.LayerBytes, d.LayerInodes = s.layerUsage(c)
	if d.Fs, err = s.layerFilesystem(s.opts.LayerRoot(c)); err != nil {
		return d, false, err
	}
	return d, true, nil
}

// layerFilesystem is the filesystem of root, a root writable layers are
// under: the device found once, the figures now.
func (s *Collector) layerFilesystem(root string) (Filesystem, error) {
	mp, err := s.layerMount(root)
	if err != nil {
		return Filesystem{}, err
	}
	dev, ok := s.layerDevices.Load(mp)
	if !ok {
		if dev, err = mountSource("/proc/self/mountinfo", mp); err != nil {
			return Filesystem{}, err
		}
		s.layerDevices.Store(mp, dev)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mp, &st); err != nil {
		return Filesystem{}, &fs.PathError{Op: "statfs", Path: mp, Err: err}
	}
	return Filesystem{Device: dev.(string), LimitBytes: st.Blocks * uint64(st.Bsize), InodesFree: st.Ffree}, nil
}

// mountSource is the source of the mount at mountpoint in the mountinfo
// file (the last one there: the one on top), as cadvisor names a
// filesystem's device: /dev/sda1 for a disk, the fs name for others.
func mountSource(mountinfoFile, mountpoint string) (string, error) {
	f, err := os.Open(mountinfoFile)
	if err != nil {
		return "", err
	}
	defer f.Close()
	mounts, err := mountinfo.GetMountsFromReader(f, func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != mountpoint, false
	})
	if err != nil {
		return "", fmt.Errorf("%s: %w", mountinfoFile, err)
	}
	if len(mounts) == 0 {
		return "", fmt.Errorf("%s: no mount at %s", mountinfoFile, mountpoint)
	}
	return mounts[len(mounts)-1].Source, nil
}

// countFDs counts the open file descriptors of the processes pids, and
// those that are sockets, as cadvisor does: an entry of /proc/<pid>/fd
// each, a socket where its link reads socket:[inode]. The names are read
// a buffer at a time, and each link with readlinkat relative to the
// folder: a process of many thousand descriptors costs a syscall per
// descriptor, and is never held whole. A process gone meanwhile counts
// nothing.
func countFDs(pids []int) (fds, sockets uint64) {
	buf := make([]byte, 16<<10)
	var names []string
	var link [16]byte // only the prefix "socket:" matters
	for _, pid := range pids {
		dir, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		for {
			n, err := unix.Getdents(dir, buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				break
			}
			_, _, names = unix.ParseDirent(buf[:n], -1, names[:0]) // without . and ..
			for _, name := range names {
				fds++
				if m, err := unix.Readlinkat(dir, name, link[:]); err == nil && bytes.HasPrefix(link[:m], []byte("socket:")) {
					sockets++
				}
			}
		}
		unix.Close(dir)
	}
	return fds, sockets
}
