package sandbox

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/image/unpack"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/sandbox/store"
)

// A container whose image is a checkpoint (an OCI image whose one layer is
// a checkpoint archive, marked by checkpointImageAnnotations) is restored,
// as containerd and CRI-O restore one: its root filesystem is the
// checkpointed container's image with the archive's layer changes in its
// writable layer, its process is the archive's, and Start has CRIU restore
// its processes, in the new pod's namespaces and cgroup.

// checkpointOf is the name of the container img is a checkpoint of, and
// the annotation that says so; "" when img is no checkpoint.
func checkpointOf(img *image.Image) (name, annotation string) {
	for _, a := range checkpointImageAnnotations {
		if name, ok := img.Annotations[a]; ok {
			return name, a
		}
	}
	return "", ""
}

// imageSource names the checkpoint image ref (img) in errors.
func imageSource(ref string, img *image.Image) string {
	name, a := checkpointOf(img)
	return fmt.Sprintf("image %s, a checkpoint of container %q (annotation %s),", ref, name, a)
}

// checkRestorable refuses what berth cannot restore into: a pod with its
// own user namespace (the archive's files and CRIU's images hold the IDs
// of the checkpointed container's), or a terminal (CRIU would need the old
// one's). source names the checkpoint.
func checkRestorable(source string, withUserNS, tty bool) error {
	switch {
	case withUserNS:
		return errkind.Errorf(errkind.FailedPrecondition, "%s: berth cannot restore it into a pod with a user namespace", strings.TrimSuffix(source, ","))
	case tty:
		return errkind.Errorf(errkind.FailedPrecondition, "%s: berth cannot restore a container with a terminal (tty)", strings.TrimSuffix(source, ","))
	}
	return nil
}

// checkpointOwner is the owner of the lease a restored container holds on
// its checkpoint image's layer, the archive, which Start reads CRIU's
// images from.
func checkpointOwner(containerID string) string { return containerID + "/checkpoint" }

// releaseCheckpoint releases a restored container's lease on its
// checkpoint image.
func (m *Manager) releaseCheckpoint(c *store.Container) error {
	if !c.Restored {
		return nil
	}
	return m.opts.Images.Release(checkpointOwner(c.ID))
}

// checkpoint is a container's checkpoint: the archive's files, as a
// checkpoint image's layer or a pod checkpoint's container folder holds
// them.
type checkpoint struct {
	dir       string // the archive's files
	imagesDir string // CRIU's images, which Start restores the processes from
	source    string // names the checkpoint in errors
	// matchProcess: the container's config describes the checkpointed
	// process (RestorePod), and a config that makes another is refused.
	matchProcess bool
	config       ckptConfig
	spec         specs.Spec
}

// corrupt is the error of a checkpoint berth cannot restore from.
func (ck *checkpoint) corrupt(format string, a ...any) error {
	return corruptSource(ck.source, format, a...)
}

// corruptSource is the error of the checkpoint source names, which berth
// cannot restore from.
func corruptSource(source, format string, a ...any) error {
	return errkind.Errorf(errkind.FailedPrecondition, "%s holds no archive berth can restore: %s", source, fmt.Sprintf(format, a...))
}

// loadCheckpoint reads the archive in the folder dir: config.dump,
// spec.dump, and CRIU's images. source names it in errors.
func loadCheckpoint(dir, source string) (*checkpoint, error) {
	ck := &checkpoint{dir: dir, imagesDir: filepath.Join(dir, ckptImagesDir), source: source}
	if err := readDump(filepath.Join(ck.dir, ckptConfigDump), &ck.config); err != nil {
		return nil, err
	}
	if ck.config.RootfsImageRef == "" && ck.config.RootfsImageName == "" {
		return nil, fmt.Errorf("%s names no image", ckptConfigDump)
	}
	if err := readDump(filepath.Join(ck.dir, ckptSpecDump), &ck.spec); err != nil {
		return nil, err
	}
	if ck.spec.Process == nil || len(ck.spec.Process.Args) == 0 {
		return nil, fmt.Errorf("%s has no process", ckptSpecDump)
	}
	if fi, err := os.Stat(filepath.Join(ck.imagesDir, "inventory.img")); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("no CRIU images (%s/inventory.img)", ckptImagesDir)
	}
	return ck, nil
}

// readDump decodes the JSON file at p into v.
func readDump(p string, v any) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	return nil
}

// rootfsImage is the image the checkpointed container was made from, which
// the restored one's root filesystem is made from: by ID, else by name.
func (m *Manager) rootfsImage(ref string, ck *checkpoint) (*image.Image, error) {
	var img *image.Image
	err := image.ErrNotFound
	for _, r := range []string{ck.config.RootfsImageRef, ck.config.RootfsImageName} {
		if r != "" && errors.Is(err, image.ErrNotFound) {
			img, err = m.opts.Images.Get(r)
		}
	}
	if errors.Is(err, image.ErrNotFound) {
		return nil, errkind.Errorf(errkind.FailedPrecondition, "image %s is a checkpoint of a container of image %s (%s), which is not on this node: pull it first",
			ref, ck.config.RootfsImageName, ck.config.RootfsImageRef)
	}
	if err != nil {
		return nil, err
	}
	if name, _ := checkpointOf(img); name != "" {
		return nil, ck.corrupt("its container's image %s is a checkpoint too", img.ID)
	}
	if _, err := spec.StopSignal(img.Config.Config.StopSignal); err != nil {
		return nil, errkind.Errorf(errkind.Invalid, "image %s: StopSignal: %v", img.ID, err)
	}
	return img, nil
}

// readCheckpoint leases the checkpoint image's layer, reads the archive in
// it, and makes the container of the checkpointed container's image.
func (r *containerCreate) readCheckpoint() error {
	owner := checkpointOwner(r.c.ID)
	layers, err := r.m.opts.Images.Lease(owner, r.img)
	if err != nil {
		return err
	}
	r.u.add("release checkpoint image", func() error { return r.m.opts.Images.Release(owner) })
	source := imageSource(r.c.ImageRef, r.img)
	if len(layers) != 1 {
		return corruptSource(source, "it has %d layers; a checkpoint image has one, the archive", len(layers))
	}
	if r.restore, err = loadCheckpoint(layers[0], source); err != nil {
		return corruptSource(source, "%v", err)
	}
	if r.img, err = r.m.rootfsImage(r.c.ImageRef, r.restore); err != nil {
		return err
	}
	r.c.StopSignal = r.img.Config.Config.StopSignal
	return nil
}

// applyLayerChanges makes the writable layer the checkpointed container's:
// its files (rootfs-diff.tar) and its deletions (deleted.files, as
// whiteouts), unpacked as an image layer is, never outside the layer.
func (r *containerCreate) applyLayerChanges() error {
	upper := r.m.layout(r.c, nil).Upper
	if err := os.Mkdir(upper, 0o755); err != nil {
		return err
	}
	var deleted []string
	if err := readDump(filepath.Join(r.restore.dir, ckptDeletedList), &deleted); err != nil && !errors.Is(err, os.ErrNotExist) {
		return r.restore.corrupt("%v", err)
	}
	var diff io.Reader // none: the container changed no file
	if f, err := os.Open(filepath.Join(r.restore.dir, ckptRootfsDiff)); err == nil {
		defer f.Close()
		diff = f
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeLayer(pw, diff, deleted)) }()
	_, err := unpack.Unpack(r.ctx, pr, upper, unpack.Options{AllowDevices: true})
	pr.CloseWithError(err) // stops the writer if Unpack gave up
	if err != nil {
		return r.restore.corrupt("%s: %v", ckptRootfsDiff, err)
	}
	return nil
}

// writeLayer writes an image layer of the files of diff (a tar; nil: none)
// and the OCI whiteouts of the paths deleted.
func writeLayer(w io.Writer, diff io.Reader, deleted []string) error {
	tw := tar.NewWriter(w)
	if diff != nil {
		tr := tar.NewReader(diff)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
	}
	for _, p := range deleted {
		clean := strings.TrimPrefix(path.Clean("/"+p), "/")
		if clean == "" {
			return fmt.Errorf("%s: deletes the root", ckptDeletedList)
		}
		dir, base := path.Split(clean)
		if err := tw.WriteHeader(&tar.Header{Name: dir + ".wh." + base, Typeflag: tar.TypeReg, Mode: 0o600}); err != nil {
			return err
		}
	}
	return tw.Close()
}

// restoreProcess makes s's process the checkpointed container's: its
// command, environment, folder and user, which execs in the restored
// container take (CRIU restores the running processes' own).
func (ck *checkpoint) restoreProcess(s *specs.Spec) {
	p := ck.spec.Process
	s.Process.Args, s.Process.Env, s.Process.Cwd, s.Process.User = p.Args, p.Env, p.Cwd, p.User
}

// restoreRequest is where the shim's CRIU reads c's checkpoint and works.
func (r *containerCreate) restoreRequest() *shim.RestoreRequest {
	return &shim.RestoreRequest{ImagesDir: r.restore.imagesDir, WorkDir: filepath.Join(r.m.layerDir(r.c), "restore")}
}

// startError is the error of a shim's Start: a restore CRIU failed, with
// its reason, is the checkpoint's or the node's (FailedPrecondition).
func startError(err error) error {
	if errors.Is(err, shim.ErrRestore) {
		return errkind.Errorf(errkind.FailedPrecondition, "%v", err)
	}
	return err
}

// copyCRIUImages copies a pod checkpoint's CRIU images of the container
// into its writable layer's folder, which Start restores from: the
// checkpoint folder is the caller's, which may go before the container
// starts, and berth must not write into it.
func (r *containerCreate) copyCRIUImages() error {
	dst := filepath.Join(r.m.layerDir(r.c), ckptImagesDir)
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(r.restore.imagesDir)
	if err != nil {
		return r.restore.corrupt("%v", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return r.restore.corrupt("%s/%s: not a regular file", ckptImagesDir, e.Name())
		}
		if err := copyFile(filepath.Join(r.restore.imagesDir, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	r.restore.imagesDir = dst
	return nil
}

// copyFile copies the regular file src to the new file dst, readable by
// root only (process memory).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// checkProcess refuses, for a checkpoint whose container's config must
// describe its process (RestorePod), a spec whose process is not the
// checkpointed one: its command, folder, user and environment (but for
// HOSTNAME, the new pod's).
func (ck *checkpoint) checkProcess(s *specs.Spec) error {
	if !ck.matchProcess {
		return nil
	}
	want, got := ck.spec.Process, s.Process
	mismatch := func(field string, g, w any) error {
		return errkind.Errorf(errkind.Invalid, "container_configs %q: %s %v is not the checkpointed process's %v", ck.config.Name, field, g, w)
	}
	switch {
	case !slices.Equal(got.Args, want.Args):
		return mismatch("command and args", got.Args, want.Args)
	case got.Cwd != want.Cwd:
		return mismatch("working_dir", got.Cwd, want.Cwd)
	case got.User.UID != want.User.UID || got.User.GID != want.User.GID:
		return mismatch("user (uid, gid)", []uint32{got.User.UID, got.User.GID}, []uint32{want.User.UID, want.User.GID})
	case !slices.Equal(withoutHostname(got.Env), withoutHostname(want.Env)):
		return mismatch("envs", withoutHostname(got.Env), withoutHostname(want.Env))
	}
	return nil
}

// withoutHostname is env, sorted, less HOSTNAME, which a pod's hostname
// sets.
func withoutHostname(env []string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, "HOSTNAME=") })
	slices.Sort(out)
	return out
}
