package sandbox

import (
	"archive/tar"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/store"
)

// The checkpoint archive is laid out as containerd's and CRI-O's are, so
// that checkpointctl and their restore read it: CRIU's images under
// checkpoint/, CRIU's log and statistics, the container's config and spec,
// and its writable layer's changes. The names are checkpointctl's
// (github.com/checkpoint-restore/checkpointctl/lib).
const (
	ckptImagesDir   = "checkpoint"
	ckptConfigDump  = "config.dump"
	ckptSpecDump    = "spec.dump"
	ckptRootfsDiff  = "rootfs-diff.tar"
	ckptDeletedList = "deleted.files"
)

// checkpointImageAnnotations mark an OCI image built from a checkpoint
// archive, whose container a runtime restores rather than runs: the one
// checkpointctl defines (containerd looks for it) and CRI-O's.
var checkpointImageAnnotations = []string{"org.criu.checkpoint.container.name", "io.kubernetes.cri-o.annotations.checkpoint.name"}

// DefaultCheckpointTimeout bounds a checkpoint whose request names no
// timeout (the CRI's "0: the runtime's default").
const DefaultCheckpointTimeout = 5 * time.Minute

// checkpointGrace is how long past the checkpoint's timeout berthd waits
// for the shim's answer: the shim stops CRIU at the timeout and thaws the
// container, then says so.
const checkpointGrace = 10 * time.Second

// ckptConfig is config.dump: checkpointctl's ContainerConfig (a reduced
// copy of Podman's checkpoint metadata), with its JSON names.
type ckptConfig struct {
	ID              string    `json:"id"`
	Name            string    `json:"name"`
	RootfsImage     string    `json:"rootfsImage,omitempty"`
	RootfsImageRef  string    `json:"rootfsImageRef,omitempty"`
	RootfsImageName string    `json:"rootfsImageName,omitempty"`
	OCIRuntime      string    `json:"runtime,omitempty"`
	CreatedTime     time.Time `json:"createdTime"`
	CheckpointedAt  time.Time `json:"checkpointedTime"`
	RestoredAt      time.Time `json:"restoredTime"`
	Restored        bool      `json:"restored"`
}

// criuProbe is whether the node's CRIU can checkpoint, asked once per
// daemon: `criu check` takes a while and its answer is the kernel's and the
// package's, which do not change under a running berthd.
type criuProbe struct {
	once sync.Once
	err  error
}

// usable runs `criu check` the first time; its error names what is
// missing.
func (p *criuProbe) usable() error {
	p.once.Do(func() {
		bin, err := exec.LookPath("criu")
		if err != nil {
			p.err = errors.New("checkpoint needs CRIU, and there is no criu on berthd's PATH (Debian: apt-get install criu)")
			return
		}
		out, err := exec.Command(bin, "check").CombinedOutput()
		if err != nil {
			p.err = fmt.Errorf("checkpoint needs CRIU, and `%s check` fails on this node (%v): %s", bin, err, lastLines(string(out), 3))
		}
	})
	return p.err
}

// lastLines is the last n non-empty lines of s, joined with "; ".
func lastLines(s string, n int) string {
	var lines []string
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "; ")
}

// CheckpointContainer has CRIU checkpoint a running container, which runs
// on, into a tar archive at location (see ckptImagesDir). timeout bounds
// CRIU's part, while the container is frozen (0: DefaultCheckpointTimeout).
// On any failure nothing is left at location or beside it, and the
// container runs on.
func (m *Manager) CheckpointContainer(ctx context.Context, id, location string, timeout time.Duration) error {
	if err := checkLocation(location); err != nil {
		return err
	}
	c, unlock, err := m.lockContainer(id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := m.checkCheckpointable(c); err != nil {
		return err
	}
	if timeout, err = checkpointTimeout(ctx, c.ID, timeout); err != nil {
		return err
	}
	// CRIU's images are as big as the container's memory: they go beside
	// the archive, on its filesystem, not on the state folder's tmpfs.
	work, err := os.MkdirTemp(filepath.Dir(location), ".berth-checkpoint-")
	if err != nil {
		return errkind.Errorf(errkind.Invalid, "location %s: %v", location, err)
	}
	defer os.RemoveAll(work)
	if err := m.dumpContainer(ctx, c, work, timeout); err != nil {
		return err
	}
	if err := writeArchive(work, location); err != nil {
		return fmt.Errorf("checkpoint of %s: %w", c.ID, err)
	}
	return nil
}

// checkCheckpointable refuses a container that is not running, or a node
// whose CRIU cannot checkpoint.
func (m *Manager) checkCheckpointable(c *store.Container) error {
	if err := m.checkRunning(c); err != nil {
		return err
	}
	return m.checkCRIU()
}

// checkRunning refuses a container that is not running.
func (m *Manager) checkRunning(c *store.Container) error {
	if st := m.containerState(c); st.Status != shim.StatusRunning {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is %s, not running: only a running container can be checkpointed", c.ID, st.Status)
	}
	return nil
}

// checkCRIU refuses a node whose CRIU cannot checkpoint.
func (m *Manager) checkCRIU() error {
	if err := m.criu.usable(); err != nil {
		return errkind.Errorf(errkind.FailedPrecondition, "%v", err)
	}
	return nil
}

// checkpointTimeout is how long CRIU may take to checkpoint container id:
// timeout (0: DefaultCheckpointTimeout), less what the call's deadline
// leaves the shim to stop CRIU and answer before the caller gives up.
func checkpointTimeout(ctx context.Context, id string, timeout time.Duration) (time.Duration, error) {
	timeout = cmp.Or(timeout, DefaultCheckpointTimeout)
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d) - checkpointGrace; left < timeout {
			timeout = left
		}
		if timeout <= 0 {
			return 0, errkind.Errorf(errkind.DeadlineExceeded, "checkpoint of %s: the call's deadline leaves no time to checkpoint", id)
		}
	}
	return timeout, nil
}

// dumpContainer has CRIU checkpoint c, which runs on (or stays frozen, if
// it was), into the folder work, and writes beside CRIU's images what a
// restore needs of it: the archive's files (see ckptImagesDir).
func (m *Manager) dumpContainer(ctx context.Context, c *store.Container, work string, timeout time.Duration) error {
	if err := m.writeCRIUConfig(c); err != nil {
		return err
	}
	if err := m.criuDump(ctx, c, work, timeout); err != nil {
		return err
	}
	if err := m.writeCheckpointFiles(c, work); err != nil {
		return fmt.Errorf("checkpoint of %s: %w", c.ID, err)
	}
	return nil
}

// writeCRIUConfig writes the file c's spec names as CRIU's configuration
// (shim.AnnotationCRIUConfig), the only one its checkpoints take: the
// operator's [checkpoint] criu_config as it is now, or nothing.
func (m *Manager) writeCRIUConfig(c *store.Container) error {
	var conf []byte
	if f := m.opts.CRIUConfig; f != "" {
		var err error
		if conf, err = os.ReadFile(f); err != nil {
			return errkind.Errorf(errkind.FailedPrecondition, "checkpoint.criu_config: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(m.bundleDir(c.PodID, c.ID), shim.CRIUConfigFile), conf, 0o600); err != nil {
		return fmt.Errorf("checkpoint of %s: %w", c.ID, err)
	}
	return nil
}

// checkLocation refuses a location that cannot be the archive: not an
// absolute path, a folder, or in a folder that does not exist. A file there
// is replaced (the kubelet names each checkpoint anew).
func checkLocation(location string) error {
	if location == "" {
		return errkind.Errorf(errkind.Invalid, "location: empty; the archive's path is needed")
	}
	if !filepath.IsAbs(location) {
		return errkind.Errorf(errkind.Invalid, "location %q: not an absolute path", location)
	}
	if fi, err := os.Stat(location); err == nil && fi.IsDir() {
		return errkind.Errorf(errkind.Invalid, "location %s: a folder; the archive's file name is needed", location)
	}
	dir := filepath.Dir(location)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return errkind.Errorf(errkind.Invalid, "location %s: its folder %s does not exist", location, dir)
	}
	return nil
}

// criuDump has the pod's shim checkpoint c into work (CRIU's images under
// ckptImagesDir, its log and statistics in work itself).
func (m *Manager) criuDump(ctx context.Context, c *store.Container, work string, timeout time.Duration) error {
	client, err := m.podShim(c.PodID)
	if err != nil {
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running: %v", c.ID, err)
	}
	// The shim answers within timeout and a thaw; the call waits for
	// that even when the caller has gone, so that work is not removed
	// under CRIU.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout+checkpointGrace)
	defer cancel()
	err = client.Checkpoint(callCtx, shim.CheckpointRequest{ID: c.ID,
		ImagesDir: filepath.Join(work, ckptImagesDir), WorkDir: work, Timeout: timeout})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, shim.ErrCheckpoint):
		return errkind.Errorf(errkind.FailedPrecondition, "%v", err)
	case errors.Is(err, shim.ErrCheckpointTimeout):
		return errkind.Errorf(errkind.DeadlineExceeded, "%v", err)
	case errors.Is(err, shim.ErrNoCheckpoint):
		return errkind.Errorf(errkind.FailedPrecondition, "container %s: its pod's shim is from a berth without checkpoints; a pod started now can be checkpointed", c.ID)
	case errors.Is(err, shim.ErrNotRunning) || shim.IsNotFound(err) || errors.Is(err, shim.ErrUnavailable):
		return errkind.Errorf(errkind.FailedPrecondition, "container %s is not running: %v", c.ID, err)
	}
	return fmt.Errorf("checkpoint of %s: %w", c.ID, err)
}

// writeCheckpointFiles puts beside CRIU's images what a restore needs of
// the container besides its processes: config.dump, spec.dump, and the
// writable layer's changes (rootfs-diff.tar, deleted.files).
func (m *Manager) writeCheckpointFiles(c *store.Container, work string) error {
	specJSON, err := os.ReadFile(filepath.Join(m.bundleDir(c.PodID, c.ID), shim.ConfigFile))
	if err != nil {
		return err
	}
	var spec specs.Spec
	if err := json.Unmarshal(specJSON, &spec); err != nil {
		return fmt.Errorf("%s: %w", shim.ConfigFile, err)
	}
	if err := os.WriteFile(filepath.Join(work, ckptSpecDump), specJSON, 0o600); err != nil {
		return err
	}
	cfg := ckptConfig{
		ID: c.ID, Name: c.Config.GetMetadata().GetName(),
		RootfsImage: c.ImageRef, RootfsImageRef: c.ImageID, RootfsImageName: cmp.Or(c.ImageName, c.ImageRef),
		OCIRuntime: "berth", CreatedTime: c.CreatedAt, CheckpointedAt: time.Now(),
	}
	if err := writeJSON(filepath.Join(work, ckptConfigDump), cfg); err != nil {
		return err
	}
	var mounts []string
	for _, mnt := range spec.Mounts {
		mounts = append(mounts, strings.Trim(filepath.Clean(mnt.Destination), "/"))
	}
	deleted, err := tarLayerChanges(filepath.Join(m.layerDir(c), "upper"), filepath.Join(work, ckptRootfsDiff), mounts)
	if err != nil {
		return fmt.Errorf("writable layer: %w", err)
	}
	if len(deleted) > 0 {
		return writeJSON(filepath.Join(work, ckptDeletedList), deleted)
	}
	return nil
}

// tarLayerChanges writes the files of an overlay upper layer to a tar at
// out, and returns the paths it deletes (its whiteouts, "/etc/motd"). The
// mount points under mounts (paths without a leading "/") are left out:
// what the layer holds there are the empty stubs the runtime made to mount
// on, and the mounts come back with the container's spec.
func tarLayerChanges(upper, out string, mounts []string) (deleted []string, err error) {
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	links := map[uint64]string{} // inode → the first name written, for hard links
	err = filepath.WalkDir(upper, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, path)
		if err != nil || rel == "." {
			return err
		}
		for _, mnt := range mounts {
			if mnt != "" && (rel == mnt || strings.HasPrefix(rel, mnt+"/")) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		// overlayfs marks a deleted file with a 0:0 character device.
		if fi.Mode()&fs.ModeCharDevice != 0 && st != nil && st.Rdev == 0 {
			deleted = append(deleted, "/"+rel)
			return nil
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname = rel, "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if st != nil && fi.Mode().IsRegular() && st.Nlink > 1 {
			if first, ok := links[st.Ino]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[st.Ino] = rel
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		return copySized(tw, src, hdr.Size)
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return deleted, f.Close()
}

// copySized copies exactly size bytes of src to w: the size a tar header
// said. The container runs on while its layer is archived, and a file it
// writes meanwhile can have grown (the rest is left out) or shrunk (the
// rest is zeros) since the header was taken.
func copySized(w io.Writer, src io.Reader, size int64) error {
	n, err := io.Copy(w, io.LimitReader(src, size))
	if err != nil {
		return err
	}
	_, err = io.CopyN(w, zeros{}, size-n)
	return err
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// writeArchive tars the folder work into a temporary file beside location,
// syncs it and renames it to location, so that location is the whole
// archive or nothing.
func writeArchive(work, location string) (err error) {
	f, err := os.CreateTemp(filepath.Dir(location), ".berth-checkpoint-*.tar")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(0o600); err != nil { // process memory: the node's root only
		return err
	}
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(work)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), location)
}
