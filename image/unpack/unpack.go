package unpack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/berth-runtime/berth/cri/errkind"
)

// Options tune what a layer may contain.
type Options struct {
	// AllowDevices permits character and block device nodes (other than
	// whiteouts). Off by default: such entries make Unpack fail.
	AllowDevices bool
	// MaxBytes bounds the sum of the file sizes a layer declares (sparse
	// files count their full size, holes included); 0 means no bound. The
	// caller bounds the tar stream itself with Bound.
	MaxBytes int64
	// MaxEntries bounds the tar entries of a layer; 0 means no bound.
	MaxEntries int64
}

// ErrTooLarge is returned (wrapped) when a layer exceeds Options.MaxBytes,
// Options.MaxEntries or the bound of a Bound reader: FailedPrecondition,
// as the bounds are the node's configuration, not a fault of the request.
var ErrTooLarge = errkind.New(errkind.FailedPrecondition, "layer too large")

// Stats describes what was written.
type Stats struct {
	Bytes  int64 // sum of regular file sizes
	Inodes int64 // entries created (files, dirs, links, whiteouts)
}

const (
	maxSymlinkHops = 40 // as Linux's MAXSYMLINKS
	copyBufSize    = 1 << 20
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	paxXattrPrefix = "SCHILY.xattr."
	overlayXattrNS = "trusted.overlay."
)

var (
	errEscape    = errors.New("escapes the layer root")
	errTruncated = errors.New("truncated layer")
)

// bufPool keeps copy buffers across layers so a pull does not allocate 1 MiB
// per layer.
var bufPool = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// unpacker is the state of one Unpack call.
type unpacker struct {
	ctx   context.Context
	root  string
	opts  Options
	stats Stats
	tr    *tar.Reader
	buf   []byte
	// dirs caches resolved parent directories: root-relative name -> host
	// path made only of real directories. Cleared whenever an entry replaces
	// something, since that may change how names resolve.
	dirs  map[string]string
	times []dirTimes // directories whose times are set once all entries exist
	lr    io.LimitedReader
	w     fdWriter
	st    unix.Stat_t
}

type dirTimes struct {
	name, path string
	ts         [2]unix.Timespec
}

// Unpack reads an uncompressed tar stream (one OCI image layer) from r and
// recreates it inside dir, which must exist and be empty. It never creates,
// changes or follows anything outside dir. It stops at the tar end marker
// (it does not need to read r to EOF; the caller drains r for digesting).
func Unpack(ctx context.Context, r io.Reader, dir string, opts Options) (Stats, error) {
	root := filepath.Clean(dir)
	if err := checkEmpty(root); err != nil {
		return Stats{}, fmt.Errorf("unpack: %w", err)
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	u := &unpacker{ctx: ctx, root: root, opts: opts, tr: tar.NewReader(r), buf: *bp, dirs: make(map[string]string)}
	var entries int64

	for {
		if err := ctx.Err(); err != nil {
			return u.stats, fmt.Errorf("unpack: %w", err)
		}
		hdr, err := u.tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			// Only with GODEBUG=tarinsecurepath=0; report it like our own check.
			if hdr != nil && errors.Is(err, tar.ErrInsecurePath) {
				return u.stats, fmt.Errorf("unpack: entry %q: %w", hdr.Name, errEscape)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = errTruncated
			}
			return u.stats, fmt.Errorf("unpack: reading tar: %w", err)
		}
		if entries++; opts.MaxEntries > 0 && entries > opts.MaxEntries {
			return u.stats, fmt.Errorf("unpack: %w: more than %d entries", ErrTooLarge, opts.MaxEntries)
		}
		if err := u.entry(hdr); err != nil {
			return u.stats, fmt.Errorf("unpack: entry %q: %w", hdr.Name, err)
		}
	}

	// Creating children changes a directory's mtime, so directories get
	// their times last.
	for i := range u.times {
		d := &u.times[i]
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, d.path, d.ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return u.stats, fmt.Errorf("unpack: entry %q: %w", d.name, os.NewSyscallError("utimensat", err))
		}
	}
	return u.stats, nil
}

func checkEmpty(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("%s is not empty (found %q)", dir, names[0])
}

// cleanName turns a tar entry name into a clean root-relative name; "" is
// the root itself.
func cleanName(name string) (string, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return "", errors.New("invalid name")
	}
	name = strings.TrimPrefix(name, "./")
	if path.IsAbs(name) {
		return "", errEscape
	}
	name = path.Clean(name)
	if name == "." {
		return "", nil
	}
	if name == ".." || strings.HasPrefix(name, "../") {
		return "", errEscape
	}
	return name, nil
}

// splitName splits a clean root-relative name into its parent and last
// component.
func splitName(rel string) (parent, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

// resolveDir returns the host path of directory rel (clean, root-relative),
// walking it one component at a time with Lstat. Symlinks met on the way
// (left by earlier entries) are followed only while they stay inside the
// root. Missing directories are created (0755, owned by us) when create is
// set; real layers sometimes omit parents.
func (u *unpacker) resolveDir(rel string, create bool) (string, error) {
	if rel == "" {
		return u.root, nil
	}
	if p, ok := u.dirs[rel]; ok {
		return p, nil
	}
	cur, rest, hops := "", rel, 0 // cur: resolved so far, never through a symlink
	for rest != "" {
		var comp string
		comp, rest, _ = strings.Cut(rest, "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			// Entry names are clean, so ".." only comes from a symlink target.
			if cur == "" {
				return "", fmt.Errorf("symlink escape: %q climbs out of the layer root", rel)
			}
			cur, _ = splitName(cur)
			continue
		}
		next := comp
		if cur != "" {
			next = cur + "/" + comp
		}
		hp := u.root + "/" + next
		err := unix.Lstat(hp, &u.st)
		switch {
		case err == unix.ENOENT && create:
			// Nothing we create may look like a whiteout marker.
			if strings.HasPrefix(comp, whiteoutPrefix) {
				return "", fmt.Errorf("parent %q is a whiteout name", next)
			}
			if err := unix.Mkdir(hp, 0o755); err != nil {
				return "", os.NewSyscallError("mkdir", err)
			}
			if err := unix.Chmod(hp, 0o755); err != nil { // umask
				return "", os.NewSyscallError("chmod", err)
			}
			u.stats.Inodes++
		case err != nil:
			return "", fmt.Errorf("parent %q: %w", next, os.NewSyscallError("lstat", err))
		case u.st.Mode&unix.S_IFMT == unix.S_IFDIR:
		case u.st.Mode&unix.S_IFMT == unix.S_IFLNK:
			if hops++; hops > maxSymlinkHops {
				return "", fmt.Errorf("parent %q: too many levels of symbolic links", rel)
			}
			target, err := os.Readlink(hp)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				return "", fmt.Errorf("symlink escape: %q -> %q is absolute", next, target)
			}
			// The target is relative to the link's directory, which is cur.
			if rest != "" {
				target += "/" + rest
			}
			rest = target
			continue
		default:
			return "", fmt.Errorf("parent %q is not a directory", next)
		}
		cur = next
	}
	hp := u.root
	if cur != "" {
		hp += "/" + cur
	}
	u.dirs[rel] = hp
	return hp, nil
}

// replacing runs mk, which creates something at p. If an earlier entry of
// this layer left something there, that is removed (never followed) and mk
// runs once more.
func (u *unpacker) replacing(p string, mk func() error) error {
	err := mk()
	if errors.Is(err, unix.EEXIST) {
		if err = u.remove(p); err == nil {
			err = mk()
		}
	}
	return err
}

// remove deletes what an earlier entry put at p, a path whose parents are
// real directories.
func (u *unpacker) remove(p string) error {
	if err := unix.Lstat(p, &u.st); err != nil {
		return os.NewSyscallError("lstat", err)
	}
	var err error
	if u.st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = os.RemoveAll(p) // does not follow symlinks inside
	} else if err = unix.Unlink(p); err != nil {
		err = os.NewSyscallError("unlink", err)
	}
	// Cached resolutions and pending directory times may go through p.
	clear(u.dirs)
	kept := u.times[:0]
	for _, d := range u.times {
		if d.path != p && !strings.HasPrefix(d.path, p+"/") {
			kept = append(kept, d)
		}
	}
	u.times = kept
	return err
}

// Bound returns a reader of r that fails with ErrTooLarge once more than max
// bytes were read from it.
func Bound(r io.Reader, max int64) io.Reader { return &boundedReader{r: r, left: max, max: max} }

type boundedReader struct {
	r         io.Reader
	left, max int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a stream of exactly max bytes from a longer one.
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("%w: more than %d bytes uncompressed", ErrTooLarge, b.max)
		}
		return b.r.Read(p[:0])
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// ctxReader stops a long file copy as soon as its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// fdWriter writes to a raw file descriptor, so copying uses our buffer and
// no *os.File is built per file.
type fdWriter struct{ fd int }

func (w *fdWriter) Write(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Write(w.fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, os.NewSyscallError("write", err)
		}
		if m == 0 {
			return n, io.ErrShortWrite
		}
		n += m
	}
	return n, nil
}
