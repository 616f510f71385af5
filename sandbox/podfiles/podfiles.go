// Package podfiles writes the files a pod's containers share — /etc/hosts,
// /etc/resolv.conf, /etc/hostname — and mounts the pod's /dev/shm.
package podfiles

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/berth-runtime/berth/cri/atomicfile"
	"github.com/berth-runtime/berth/cri/errkind"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultShmSize is the size of a pod's /dev/shm when none is asked for,
// the same as Docker and containerd.
const DefaultShmSize = 64 << 20

// Options describes the pod's files.
type Options struct {
	// Dir receives hosts, resolv.conf and hostname; shm is mounted at Dir/shm.
	Dir      string
	Hostname string
	// PodIPs each get an "IP hostname" line in hosts; empty before the
	// pod's network is set up.
	PodIPs []string
	// DNS builds resolv.conf; nil copies the host's, which is what the
	// kubelet expects for the "Default" DNS policy.
	DNS *runtimeapi.DNSConfig
	// HostNetwork makes hosts a copy of the host's and hostname the host's.
	// resolv.conf still follows DNS: ClusterFirstWithHostNet pods get the
	// cluster's DNS with the host's network.
	HostNetwork bool
	// ShmSize in bytes; 0 means DefaultShmSize.
	ShmSize int64
	// HostIPC pods use the host's /dev/shm: none is mounted.
	HostIPC bool
	// RootUID and RootGID own hosts, resolv.conf and hostname: the host IDs
	// of the root of a pod with a user namespace of its own, whose
	// containers bind them without idmapping; 0 (host root) otherwise.
	RootUID, RootGID int
}

// Files are the paths Write made; Shm is "" for a HostIPC pod.
type Files struct{ Hosts, Resolv, Hostname, Shm string }

// Where the host's own files are read from; tests point them elsewhere.
var (
	hostHostsPath  = "/etc/hosts"
	hostResolvPath = "/etc/resolv.conf"
)

// Write writes the files (each replaced atomically) and mounts the pod's shm.
// It may be called again to rewrite the files; an existing shm mount is
// kept. On failure it removes the files and mount this call made.
func Write(opts Options) (Files, error) {
	if opts.Dir == "" {
		return Files{}, errors.New("podfiles: Dir is empty")
	}
	size := opts.ShmSize
	if size < 0 {
		return Files{}, errkind.Errorf(errkind.Invalid, "podfiles: shm size %d is negative", size)
	}
	if size == 0 {
		size = DefaultShmSize
	}
	c, err := build(opts)
	if err != nil {
		return Files{}, err
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return Files{}, err
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return Files{}, err
	}
	f := Files{
		Hosts:    filepath.Join(dir, "hosts"),
		Resolv:   filepath.Join(dir, "resolv.conf"),
		Hostname: filepath.Join(dir, "hostname"),
	}
	var made []string
	undo := func(err error) (Files, error) {
		for _, p := range made {
			err = errors.Join(err, removeFile(p))
		}
		return Files{}, err
	}
	for _, w := range []struct {
		path string
		data []byte
	}{{f.Hosts, c.hosts}, {f.Resolv, c.resolv}, {f.Hostname, c.hostname}} {
		_, statErr := os.Lstat(w.path)
		if err := writeAtomic(w.path, w.data, opts.RootUID, opts.RootGID); err != nil {
			return undo(err)
		}
		if errors.Is(statErr, os.ErrNotExist) {
			made = append(made, w.path)
		}
	}
	if !opts.HostIPC {
		f.Shm = filepath.Join(dir, "shm")
		if err := mountShm(f.Shm, size); err != nil {
			return undo(err)
		}
	}
	return f, nil
}

// Remove unmounts the pod's shm and deletes its files, including temp files
// a crash left. Missing pieces are fine: it can be repeated.
func Remove(dir string) error {
	shm := filepath.Join(dir, "shm")
	err := unmountAll(shm)
	if err == nil {
		err = removeFile(shm)
	}
	errs := []error{err}
	for _, name := range []string{"hosts", "resolv.conf", "hostname"} {
		errs = append(errs, removeFile(filepath.Join(dir, name)))
	}
	temps, _ := filepath.Glob(filepath.Join(dir, ".*"+atomicfile.TempMark+"*"))
	for _, p := range temps {
		errs = append(errs, removeFile(p))
	}
	return errors.Join(errs...)
}

func removeFile(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
