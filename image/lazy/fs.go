package lazy

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FSType is the type lazy layers are mounted with ("fuse." + their name),
// by which a restarted berthd finds the mounts its predecessor left.
const FSType = "fuse.berth-lazy"

// Overlay's whiteout conventions, as the unpacker writes them (image/unpack):
// a whiteout is a 0/0 character device, an opaque directory has an xattr.
const (
	whiteoutPrefix = ".wh."
	opaqueName     = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
)

// ttl is how long the kernel may cache names and attributes: the layer
// never changes.
const ttl = time.Hour

// Mount serves the layer read-only at dir until Close.
func (l *Layer) Mount(dir string) error {
	timeout := ttl
	root := &node{l: l}
	srv, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &timeout, AttrTimeout: &timeout, NegativeTimeout: &timeout,
		MountOptions: fuse.MountOptions{
			AllowOther: true, // the containers' users read it through the overlay
			FsName:     "berth-lazy", Name: "berth-lazy",
			DirectMount: true, DirectMountStrict: true,
			// Read-only; setuid files keep working; the kernel checks
			// permissions against the attributes served.
			DirectMountFlags: syscall.MS_RDONLY | syscall.MS_NODEV,
			Options:          []string{"default_permissions"},
			// Reads of up to 1 MiB (the kernel's most, max_pages 256):
			// at go-fuse's default MaxWrite of 128 KiB each read of a
			// cached file took one request per 128 KiB, and the kernel
			// capped MaxReadAhead at MaxWrite.
			MaxWrite:     1 << 20,
			MaxReadAhead: 1 << 20,
			// User-namespaced pods' overlays take idmapped views of their
			// lower layers (Linux 6.12+ for FUSE); the layer's answers
			// do not depend on the caller's IDs.
			IDMappedMount: true,
		},
	})
	if err != nil {
		return err
	}
	l.srv = srv
	return nil
}

// Close unmounts the layer and stops its background fetch, which is over
// when Close returns: nothing writes into the layer's folder after it. A
// mount still in use (a container's overlay) stays, and Close says so.
func (l *Layer) Close() error {
	if l.srv != nil {
		if err := l.srv.Unmount(); err != nil {
			return err
		}
		l.srv.Wait()
		l.srv = nil
	}
	l.cancel()
	l.background.Wait()
	return nil
}

// node is one entry of the layer; the root has no entry.
type node struct {
	fs.Inode
	l        *Layer
	ent      *estargz.TOCEntry
	mode     uint32 // file type and permission bits
	rdev     uint32
	opaque   bool // holds the layer's ".wh..wh..opq"
	whiteout bool // a ".wh." entry, shown as overlay's whiteout
}

var (
	_ fs.NodeOnAdder     = (*node)(nil)
	_ fs.NodeGetattrer   = (*node)(nil)
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeReader      = (*node)(nil)
	_ fs.NodeReadlinker  = (*node)(nil)
	_ fs.NodeGetxattrer  = (*node)(nil)
	_ fs.NodeListxattrer = (*node)(nil)
)

// OnAdd builds the whole tree from the TOC when the root is mounted. A
// file with several names (hard links) is one inode under each.
func (n *node) OnAdd(ctx context.Context) {
	if n.ent != nil {
		return // not the root: built with it
	}
	root, ok := n.l.toc.Lookup("")
	if !ok {
		return
	}
	n.ent, n.mode = root, syscall.S_IFDIR|uint32(root.Mode&0o7777)
	n.addChildren(ctx, n, map[*estargz.TOCEntry]*fs.Inode{})
}

// addChildren adds dir's entries under it, turning whiteouts into
// overlay's: a ".wh.NAME" file becomes a 0/0 device NAME, ".wh..wh..opq"
// marks dir opaque. The format's landmarks are not shown.
func (n *node) addChildren(ctx context.Context, dir *node, inodes map[*estargz.TOCEntry]*fs.Inode) {
	dir.ent.ForeachChild(func(base string, e *estargz.TOCEntry) bool {
		switch {
		case dir == n && (base == estargz.PrefetchLandmark || base == estargz.NoPrefetchLandmark || base == estargz.TOCTarName):
		case base == opaqueName:
			dir.opaque = true
		case inodes[e] != nil:
			dir.AddChild(base, inodes[e], true)
		default:
			child := entryNode(n.l, e)
			if strings.HasPrefix(base, whiteoutPrefix) {
				base = strings.TrimPrefix(base, whiteoutPrefix)
				child = &node{l: n.l, ent: e, mode: syscall.S_IFCHR, whiteout: true}
			}
			in := dir.NewPersistentInode(ctx, child, fs.StableAttr{Mode: child.mode & syscall.S_IFMT})
			dir.AddChild(base, in, true)
			inodes[e] = in
			if e.Type == "dir" && !child.whiteout {
				n.addChildren(ctx, child, inodes)
			}
		}
		return true
	})
}

// entryNode makes the node of a TOC entry that is not a hard link.
func entryNode(l *Layer, e *estargz.TOCEntry) *node {
	perm := uint32(e.Mode & 0o7777)
	types := map[string]uint32{"dir": syscall.S_IFDIR, "reg": syscall.S_IFREG, "symlink": syscall.S_IFLNK,
		"char": syscall.S_IFCHR, "block": syscall.S_IFBLK, "fifo": syscall.S_IFIFO}
	n := &node{l: l, ent: e, mode: types[e.Type] | perm}
	if e.Type == "char" || e.Type == "block" {
		n.rdev = uint32(unixMkdev(e.DevMajor, e.DevMinor))
	}
	return n
}

func unixMkdev(major, minor int) uint64 {
	return uint64(minor&0xff) | uint64(major&0xfff)<<8 | uint64(minor&^0xff)<<12
}

func (n *node) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = n.mode
	out.Rdev = n.rdev
	out.Nlink = 1
	if n.ent == nil {
		return 0
	}
	e := n.ent
	if e.Type == "reg" && !n.whiteout {
		out.Size = uint64(e.Size)
		out.Blocks = (out.Size + 511) / 512
		out.Nlink = uint32(max(e.NumLink, 1))
	}
	if e.Type == "symlink" {
		out.Size = uint64(len(e.LinkName))
	}
	out.Uid, out.Gid = uint32(e.UID), uint32(e.GID)
	t := e.ModTime()
	out.SetTimes(nil, &t, &t)
	out.SetTimeout(ttl)
	return 0
}

func (n *node) Open(context.Context, uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

// Read serves the file's bytes from its chunks; one that cannot be
// fetched or fails its digest fails the read with EIO, never with other
// bytes.
func (n *node) Read(_ context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	got, err := n.l.readAt(n.ent, dest, off)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			n.l.readFailed(n.ent.Name, err)
		}
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

func (n *node) Readlink(context.Context) ([]byte, syscall.Errno) {
	if n.ent == nil || n.ent.Type != "symlink" {
		return nil, syscall.EINVAL
	}
	return []byte(n.ent.LinkName), 0
}

func (n *node) xattrs() map[string][]byte {
	x := map[string][]byte{}
	if n.ent != nil && !n.whiteout {
		for k, v := range n.ent.Xattrs {
			x[k] = v
		}
	}
	if n.opaque {
		x[opaqueXattr] = []byte("y")
	}
	return x
}

func (n *node) Getxattr(_ context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	v, ok := n.xattrs()[attr]
	switch {
	case !ok:
		return 0, syscall.ENODATA
	case len(dest) < len(v):
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *node) Listxattr(_ context.Context, dest []byte) (uint32, syscall.Errno) {
	var b []byte
	for k := range n.xattrs() {
		b = append(append(b, k...), 0)
	}
	if len(dest) < len(b) {
		return uint32(len(b)), syscall.ERANGE
	}
	return uint32(copy(dest, b)), 0
}
