package unpack

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// entry recreates one tar entry under the root.
func (u *unpacker) entry(hdr *tar.Header) error {
	switch t := hdr.Typeflag; t {
	case tar.TypeReg, tar.TypeCont, tar.TypeGNUSparse, tar.TypeDir, tar.TypeSymlink,
		tar.TypeLink, tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
	case tar.TypeXGlobalHeader:
		return nil // PAX defaults for the archive; nothing to create
	default:
		// 'A'-'Z' are vendor extensions (GNU volume labels, multi-volume
		// parts, dumpdirs...): nothing a container needs, so skip them.
		// Anything else is not tar.
		if 'A' <= t && t <= 'Z' {
			return nil
		}
		return fmt.Errorf("unsupported entry type %q", t)
	}

	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "" { // "." or "./": the layer root itself
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("layer root entry is not a directory")
		}
		return u.dirMeta(u.root, rel, hdr)
	}
	parent, base := splitName(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(parent, base, hdr)
	}
	pdir, err := u.resolveDir(parent, true)
	if err != nil {
		return err
	}
	p := pdir + "/" + base

	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.mkdir(p, rel, hdr)
	case tar.TypeLink:
		return u.hardlink(p, hdr)
	case tar.TypeSymlink:
		err = u.replacing(p, func() error {
			return os.NewSyscallError("symlink", unix.Symlink(hdr.Linkname, p))
		})
	case tar.TypeFifo:
		err = u.mknod(p, unix.S_IFIFO, 0)
	case tar.TypeChar, tar.TypeBlock:
		if !u.opts.AllowDevices {
			return errors.New("device nodes are not allowed in layers")
		}
		mode := uint32(unix.S_IFCHR)
		if hdr.Typeflag == tar.TypeBlock {
			mode = unix.S_IFBLK
		}
		err = u.mknod(p, mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))))
	default:
		return u.file(p, hdr)
	}
	if err != nil {
		return err
	}
	u.stats.Inodes++
	if err := u.meta(p, hdr); err != nil {
		return err
	}
	ts := times(hdr)
	return os.NewSyscallError("utimensat", unix.UtimesNanoAt(unix.AT_FDCWD, p, ts[:], unix.AT_SYMLINK_NOFOLLOW))
}

func (u *unpacker) mknod(p string, mode uint32, dev int) error {
	return u.replacing(p, func() error {
		return os.NewSyscallError("mknod", unix.Mknod(p, mode, dev))
	})
}

// file writes a regular file. O_EXCL|O_NOFOLLOW: never write through
// something an earlier entry left at p.
func (u *unpacker) file(p string, hdr *tar.Header) error {
	if max := u.opts.MaxBytes; max > 0 && (hdr.Size > max || u.stats.Bytes+hdr.Size > max) {
		return fmt.Errorf("%w: files of more than %d bytes in all", ErrTooLarge, max)
	}
	var fd int
	err := u.replacing(p, func() (err error) {
		fd, err = unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		return os.NewSyscallError("open", err)
	})
	if err != nil {
		return err
	}
	u.stats.Inodes++
	err = u.fill(fd, hdr)
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = os.NewSyscallError("close", cerr)
	}
	if err != nil {
		return err
	}
	u.stats.Bytes += hdr.Size
	if err := setXattrs(p, hdr, false); err != nil {
		return err
	}
	ts := times(hdr)
	return os.NewSyscallError("utimensat", unix.UtimesNanoAt(unix.AT_FDCWD, p, ts[:], unix.AT_SYMLINK_NOFOLLOW))
}

// fill copies the content, then sets owner and mode. The copy goes through
// our buffer (the readers and fdWriter hide ReaderFrom/WriterTo) and checks
// the context at every buffer.
func (u *unpacker) fill(fd int, hdr *tar.Header) error {
	if hdr.Size > 0 {
		u.w.fd = fd
		u.lr.R, u.lr.N = u.tr, hdr.Size
		n, err := io.CopyBuffer(&u.w, ctxReader{u.ctx, &u.lr}, u.buf)
		// tar.Reader reports a cut stream as ErrUnexpectedEOF; n is checked
		// too in case a reader ends quietly.
		if errors.Is(err, io.ErrUnexpectedEOF) || (err == nil && n < hdr.Size) {
			return errTruncated
		}
		if err != nil {
			return err
		}
	}
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return os.NewSyscallError("fchown", err)
	}
	// After chown, which clears setuid/setgid.
	return os.NewSyscallError("fchmod", unix.Fchmod(fd, mode(hdr)))
}

// mkdir creates directory p, or keeps the one an earlier entry made there
// and only updates its metadata.
func (u *unpacker) mkdir(p, rel string, hdr *tar.Header) error {
	err := unix.Mkdir(p, 0o700)
	if err == unix.EEXIST {
		if err = unix.Lstat(p, &u.st); err != nil {
			return os.NewSyscallError("lstat", err)
		}
		if u.st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return u.dirMeta(p, rel, hdr)
		}
		if err = u.remove(p); err != nil {
			return err
		}
		err = unix.Mkdir(p, 0o700)
	}
	if err != nil {
		return os.NewSyscallError("mkdir", err)
	}
	u.stats.Inodes++
	u.dirs[rel] = p // p is now a real directory
	return u.dirMeta(p, rel, hdr)
}

// dirMeta sets a directory's owner, mode and xattrs now and its times at the
// end of the layer.
func (u *unpacker) dirMeta(p, rel string, hdr *tar.Header) error {
	if err := u.meta(p, hdr); err != nil {
		return err
	}
	u.times = append(u.times, dirTimes{name: hdr.Name, path: p, ts: times(hdr)})
	return nil
}

// hardlink links p to an existing non-directory inside the root.
func (u *unpacker) hardlink(p string, hdr *tar.Header) error {
	trel, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hardlink escape: target %q: %w", hdr.Linkname, err)
	}
	tparent, tbase := splitName(trel)
	tdir, err := u.resolveDir(tparent, false)
	if err != nil {
		return fmt.Errorf("hardlink escape: target %q: %w", hdr.Linkname, err)
	}
	target := tdir + "/" + tbase // the root itself ("") is refused as a directory below
	if err := unix.Lstat(target, &u.st); err != nil {
		return fmt.Errorf("hardlink escape: target %q: %w", hdr.Linkname, os.NewSyscallError("lstat", err))
	}
	if u.st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hardlink escape: target %q is a directory", hdr.Linkname)
	}
	// Flags 0: a symlink target is linked itself, not followed.
	err = u.replacing(p, func() error {
		return os.NewSyscallError("linkat", unix.Linkat(unix.AT_FDCWD, target, unix.AT_FDCWD, p, 0))
	})
	if err == nil {
		u.stats.Inodes++ // the link shares the target's metadata: nothing to set
	}
	return err
}

// whiteout turns an OCI whiteout into its overlayfs form: ".wh.NAME" becomes
// a 0/0 character device NAME, ".wh..wh..opq" marks the directory opaque.
func (u *unpacker) whiteout(parent, base string, hdr *tar.Header) error {
	name := base[len(whiteoutPrefix):]
	switch {
	case base == opaqueMarker:
	case strings.HasPrefix(name, whiteoutPrefix):
		return nil // other ".wh..wh." names are aufs bookkeeping
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("invalid whiteout name %q", base)
	}
	pdir, err := u.resolveDir(parent, true)
	if err != nil {
		return err
	}
	u.stats.Inodes++
	if base == opaqueMarker {
		return os.NewSyscallError("lsetxattr", unix.Lsetxattr(pdir, overlayXattrNS+"opaque", []byte("y"), 0))
	}
	p := pdir + "/" + name
	if err := u.mknod(p, unix.S_IFCHR, 0); err != nil {
		return err
	}
	return os.NewSyscallError("lchown", unix.Lchown(p, hdr.Uid, hdr.Gid))
}

// meta sets owner, mode (not on symlinks: Linux has no symlink modes) and
// xattrs of p, in that order: chown clears setuid/setgid and file
// capabilities.
func (u *unpacker) meta(p string, hdr *tar.Header) error {
	if err := unix.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return os.NewSyscallError("lchown", err)
	}
	symlink := hdr.Typeflag == tar.TypeSymlink
	if !symlink {
		// p's last component is what we just made, never a symlink.
		if err := unix.Chmod(p, mode(hdr)); err != nil {
			return os.NewSyscallError("chmod", err)
		}
	}
	return setXattrs(p, hdr, symlink)
}

// setXattrs applies the SCHILY.xattr.* PAX records. trusted.overlay.* ones
// are ignored: they could forge whiteouts, opaque dirs or overlay redirects.
func setXattrs(p string, hdr *tar.Header, symlink bool) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattrPrefix)
		if !ok || strings.HasPrefix(name, overlayXattrNS) {
			continue
		}
		err := unix.Lsetxattr(p, name, []byte(v), 0)
		// The filesystem cannot hold it, or Linux refuses user.* xattrs on
		// symlinks: the layer is still usable without it.
		if err == nil || err == unix.ENOTSUP || (symlink && err == unix.EPERM) {
			continue
		}
		return fmt.Errorf("xattr %q: %w", name, os.NewSyscallError("lsetxattr", err))
	}
	return nil
}

// mode is the permission part of the tar mode, with setuid, setgid, sticky.
func mode(hdr *tar.Header) uint32 { return uint32(hdr.Mode) & 0o7777 }

// times returns atime and mtime for utimensat; a missing atime is the mtime.
func times(hdr *tar.Header) [2]unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return [2]unix.Timespec{
		{Sec: at.Unix(), Nsec: int64(at.Nanosecond())},
		{Sec: hdr.ModTime.Unix(), Nsec: int64(hdr.ModTime.Nanosecond())},
	}
}
