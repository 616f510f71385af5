package unpack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	testTime   = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	secretTime = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ent is one tar entry; body is the content of regular files.
type ent struct {
	hdr  tar.Header
	body string
}

func hdr(typ byte, name string, mode int64) tar.Header {
	return tar.Header{Typeflag: typ, Name: name, Mode: mode, Uid: os.Getuid(), Gid: os.Getgid(), ModTime: testTime}
}

func reg(name, body string) ent {
	h := hdr(tar.TypeReg, name, 0o644)
	h.Size = int64(len(body))
	return ent{h, body}
}
func dir(name string) ent { return ent{hdr: hdr(tar.TypeDir, name, 0o755)} }
func sym(name, target string) ent {
	h := hdr(tar.TypeSymlink, name, 0o777)
	h.Linkname = target
	return ent{hdr: h}
}
func hard(name, target string) ent {
	h := hdr(tar.TypeLink, name, 0o644)
	h.Linkname = target
	return ent{hdr: h}
}
func dev(typ byte, name string, major, minor int64) ent {
	h := hdr(typ, name, 0o600)
	h.Devmajor, h.Devminor = major, minor
	return ent{hdr: h}
}
func with(e ent, f func(*tar.Header)) ent { f(&e.hdr); return e }
func xattr(e ent, name, value string) ent {
	return with(e, func(h *tar.Header) {
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+name] = value
	})
}

func layer(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, e := range ents {
		h := e.hdr
		if err := w.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(w, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// dirs returns an empty root to unpack into and a sibling "outside" folder
// holding one sentinel file, "secret", that no layer may touch.
func dirs(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("top secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(secret, secretTime, secretTime); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

// checkOutside asserts the outside folder is exactly as dirs left it.
func checkOutside(t *testing.T, outside string) {
	t.Helper()
	des, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(des) != 1 || des[0].Name() != "secret" {
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		t.Errorf("outside now holds %q, want only secret", names)
	}
	secret := filepath.Join(outside, "secret")
	var st unix.Stat_t
	if err := unix.Lstat(secret, &st); err != nil {
		t.Fatalf("secret: %v", err)
	}
	if st.Nlink != 1 || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != 0o644 || st.Mtim.Sec != secretTime.Unix() {
		t.Errorf("secret changed: nlink %d mode %o mtime %d", st.Nlink, st.Mode, st.Mtim.Sec)
	}
	if b, _ := os.ReadFile(secret); string(b) != "top secret" {
		t.Errorf("secret content changed: %q", b)
	}
}

func unpack(t *testing.T, root string, opts Options, ents ...ent) (Stats, error) {
	t.Helper()
	return Unpack(context.Background(), bytes.NewReader(layer(t, ents...)), root, opts)
}

func mustUnpack(t *testing.T, root string, ents ...ent) Stats {
	t.Helper()
	st, err := unpack(t, root, Options{}, ents...)
	if err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	return st
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown to other users, mknod, trusted.* xattrs)")
	}
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func getxattr(p, name string) (string, error) {
	b := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, b)
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

func TestHostileLayers(t *testing.T) {
	// outside is substituted for OUTSIDE in names and link targets.
	tests := []struct {
		name    string
		ents    []ent
		opts    Options
		root    bool   // needs root
		wantErr string // "" means Unpack succeeds
		check   func(t *testing.T, root string)
	}{
		{name: "absolute name", ents: []ent{reg("OUTSIDE/pwned", "x")}, wantErr: "escapes the layer root"},
		{name: "dotdot name", ents: []ent{reg("../outside/pwned", "x")}, wantErr: `entry "../outside/pwned": escapes the layer root`},
		{name: "dotdot after clean", ents: []ent{reg("a/../../outside/pwned", "x")}, wantErr: "escapes the layer root"},
		{name: "dot-slash dotdot", ents: []ent{reg("./../outside/pwned", "x")}, wantErr: "escapes the layer root"},
		{
			name:    "symlink parent absolute",
			ents:    []ent{sym("a", "OUTSIDE"), reg("a/pwned", "x")},
			wantErr: "symlink escape",
		},
		{
			name:    "symlink parent relative",
			ents:    []ent{sym("a", "../outside"), reg("a/pwned", "x")},
			wantErr: "symlink escape",
		},
		{
			name:    "symlink parent climbs out via chain",
			ents:    []ent{dir("d/"), sym("d/up", ".."), sym("b", "d/up/d/up/.."), reg("b/outside/pwned", "x")},
			wantErr: "symlink escape",
		},
		{
			name:    "symlink overwrite of secret",
			ents:    []ent{sym("a", "../outside"), reg("a/secret", "pwned")},
			wantErr: "symlink escape",
		},
		{
			name:    "symlink loop",
			ents:    []ent{sym("a", "b"), sym("b", "a"), reg("a/x", "x")},
			wantErr: "too many levels of symbolic links",
		},
		{
			name:    "hardlink escape",
			ents:    []ent{hard("l", "../outside/secret")},
			wantErr: "hardlink escape",
		},
		{
			name:    "hardlink absolute",
			ents:    []ent{hard("l", "OUTSIDE/secret")},
			wantErr: "hardlink escape",
		},
		{
			name:    "hardlink through symlink parent",
			ents:    []ent{sym("s", "OUTSIDE"), hard("l", "s/secret")},
			wantErr: "hardlink escape",
		},
		{
			// Linkat must not follow: l links the symlink itself.
			name: "hardlink to symlink to outside",
			ents: []ent{sym("s", "OUTSIDE/secret"), hard("l", "s")},
			check: func(t *testing.T, root string) {
				if st := lstat(t, filepath.Join(root, "l")); st.Mode&unix.S_IFMT != unix.S_IFLNK {
					t.Errorf("l mode %o, want the symlink itself", st.Mode)
				}
			},
		},
		{
			// d resolved to a real dir once; after d is replaced by a
			// symlink, a stale resolution would write through it.
			name:    "parent replaced by symlink",
			ents:    []ent{dir("d/"), reg("d/x", "x"), sym("d", "OUTSIDE"), reg("d/pwned", "x")},
			wantErr: "symlink escape",
		},
		{name: "hardlink to missing", ents: []ent{hard("l", "nope")}, wantErr: "hardlink escape"},
		{name: "hardlink to directory", ents: []ent{dir("d/"), hard("l", "d")}, wantErr: "hardlink escape"},
		{name: "hardlink to root", ents: []ent{hard("l", "./")}, wantErr: "hardlink escape"},
		{
			name:    "file over symlink to outside",
			ents:    []ent{sym("f", "OUTSIDE/secret"), reg("f", "pwned")},
			check:   func(t *testing.T, root string) { checkFile(t, filepath.Join(root, "f"), "pwned") },
			wantErr: "",
		},
		{
			name: "dir over symlink to outside",
			ents: []ent{sym("d", "OUTSIDE"), dir("d/"), reg("d/x", "x")},
			check: func(t *testing.T, root string) {
				if st := lstat(t, filepath.Join(root, "d")); st.Mode&unix.S_IFMT != unix.S_IFDIR {
					t.Errorf("d is not a directory: %o", st.Mode)
				}
			},
		},
		{
			// Directory times are set at the end; by then "a" is a symlink
			// to outside and root/a/secret would resolve to the sentinel.
			name: "dir times after parent became symlink",
			ents: []ent{dir("a/"), dir("a/secret/"), sym("a", "OUTSIDE")},
		},
		{
			// ".." as a whiteout name would remove the parent directory.
			name:    "whiteout of dotdot",
			ents:    []ent{dir("a/"), reg("a/f", "x"), reg("a/.wh..", "")},
			wantErr: "invalid whiteout name",
		},
		{
			name:    "entry under a whiteout name",
			ents:    []ent{reg("a/.wh.b/c", "x")},
			wantErr: "whiteout name",
		},
		{
			name:    "char device without AllowDevices",
			ents:    []ent{dev(tar.TypeChar, "null", 1, 3)},
			wantErr: "device nodes are not allowed",
		},
		{
			name:    "block device without AllowDevices",
			ents:    []ent{dev(tar.TypeBlock, "sda", 8, 0)},
			wantErr: "device nodes are not allowed",
		},
		{
			name: "devices with AllowDevices",
			ents: []ent{dev(tar.TypeChar, "null", 1, 3), dev(tar.TypeBlock, "sda", 8, 0)},
			opts: Options{AllowDevices: true},
			root: true,
			check: func(t *testing.T, root string) {
				if st := lstat(t, filepath.Join(root, "null")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(1, 3) {
					t.Errorf("null: mode %o rdev %x", st.Mode, st.Rdev)
				}
				if st := lstat(t, filepath.Join(root, "sda")); st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != unix.Mkdev(8, 0) {
					t.Errorf("sda: mode %o rdev %x", st.Mode, st.Rdev)
				}
			},
		},
		{
			name: "trusted.overlay xattrs ignored",
			ents: []ent{
				xattr(xattr(xattr(dir("d/"), "trusted.overlay.opaque", "y"), "trusted.overlay.redirect", "/x"), "trusted.berth", "kept"),
				xattr(reg("f", "x"), "trusted.overlay.metacopy", ""),
			},
			root: true,
			check: func(t *testing.T, root string) {
				d := filepath.Join(root, "d")
				for _, p := range []string{d, filepath.Join(root, "f")} {
					for _, x := range []string{"trusted.overlay.opaque", "trusted.overlay.redirect", "trusted.overlay.metacopy"} {
						if v, err := getxattr(p, x); err != unix.ENODATA {
							t.Errorf("%s %s = %q, %v; want ENODATA", p, x, v, err)
						}
					}
				}
				if v, err := getxattr(d, "trusted.berth"); err != nil || v != "kept" {
					t.Errorf("trusted.berth = %q, %v; other trusted xattrs should be kept", v, err)
				}
			},
		},
		{name: "bogus entry type", ents: []ent{{hdr: hdr('q', "q", 0o644)}}, wantErr: "unsupported entry type 'q'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				needRoot(t)
			}
			root, outside := dirs(t)
			ents := make([]ent, len(tt.ents))
			for i, e := range tt.ents {
				e.hdr.Name = strings.ReplaceAll(e.hdr.Name, "OUTSIDE", outside)
				e.hdr.Linkname = strings.ReplaceAll(e.hdr.Linkname, "OUTSIDE", outside)
				ents[i] = e
			}
			_, err := unpack(t, root, tt.opts, ents...)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Unpack: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Errorf("Unpack succeeded, want error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("Unpack: %v, want error containing %q", err, tt.wantErr)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "unpack: entry ") {
				t.Errorf("error %q does not name the entry", err)
			}
			checkOutside(t, outside)
			if tt.check != nil && err == nil {
				tt.check(t, root)
			}
		})
	}
}

func TestCleanName(t *testing.T) {
	for _, tt := range []struct{ in, want, err string }{
		{"a", "a", ""},
		{"./a/b/", "a/b", ""},
		{"a//b/./c", "a/b/c", ""},
		{"a/../b", "b", ""},
		{".", "", ""},
		{"./", "", ""},
		{"", "", "invalid name"},
		{"a\x00b", "", "invalid name"},
		{"/etc/passwd", "", "escapes"},
		{".//etc/passwd", "", "escapes"},
		{"..", "", "escapes"},
		{"../etc/passwd", "", "escapes"},
		{"a/../../b", "", "escapes"},
	} {
		got, err := cleanName(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("cleanName(%q) = %q, %v; want error %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("cleanName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func checkFile(t *testing.T, p, want string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Errorf("%s = %q, want %q", p, b, want)
	}
}

func TestTree(t *testing.T) {
	root, _ := dirs(t)
	fifo := ent{hdr: hdr(tar.TypeFifo, "run/fifo", 0o620)}
	st := mustUnpack(t, root,
		dir("./"),
		dir("etc/"),
		reg("etc/hosts", "127.0.0.1 localhost\n"),
		with(reg("bin/sh", "#!ELF"), func(h *tar.Header) { h.Mode = 0o755 }),
		sym("bin/bash", "sh"),
		sym("abs", "/etc/hosts"), // absolute targets are fine as symlink content
		hard("bin/dash", "bin/sh"),
		hard("etc/hosts2", "./etc/hosts"),
		dir("run/"),
		fifo,
		reg("empty", ""),
	)
	checkFile(t, filepath.Join(root, "etc/hosts"), "127.0.0.1 localhost\n")
	checkFile(t, filepath.Join(root, "bin/bash"), "#!ELF")
	if got, _ := os.Readlink(filepath.Join(root, "bin/bash")); got != "sh" {
		t.Errorf("bin/bash -> %q", got)
	}
	if got, _ := os.Readlink(filepath.Join(root, "abs")); got != "/etc/hosts" {
		t.Errorf("abs -> %q", got)
	}
	sh, dash := lstat(t, filepath.Join(root, "bin/sh")), lstat(t, filepath.Join(root, "bin/dash"))
	if sh.Ino != dash.Ino || sh.Nlink != 2 || sh.Mode&0o7777 != 0o755 {
		t.Errorf("bin/sh ino %d nlink %d mode %o, bin/dash ino %d", sh.Ino, sh.Nlink, sh.Mode, dash.Ino)
	}
	if st := lstat(t, filepath.Join(root, "run/fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o7777 != 0o620 {
		t.Errorf("run/fifo mode %o", st.Mode)
	}
	if st := lstat(t, filepath.Join(root, "etc/hosts")); st.Mode&0o7777 != 0o644 {
		t.Errorf("etc/hosts mode %o", st.Mode)
	}
	// etc, hosts, bin (implicit), sh, bash, abs, dash, hosts2, run, fifo, empty
	want := Stats{Bytes: int64(len("127.0.0.1 localhost\n") + len("#!ELF")), Inodes: 11}
	if st != want {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}
}

func TestRootEntry(t *testing.T) {
	root, _ := dirs(t)
	mustUnpack(t, root, with(dir("."), func(h *tar.Header) { h.Mode = 0o750 }), reg("f", "x"))
	st := lstat(t, root)
	if st.Mode&0o7777 != 0o750 {
		t.Errorf("root mode %o, want 750", st.Mode&0o7777)
	}
	if st.Mtim.Sec != testTime.Unix() {
		t.Errorf("root mtime %v, want %v", time.Unix(st.Mtim.Unix()), testTime)
	}
}

func TestOwnershipAndModes(t *testing.T) {
	needRoot(t)
	root, _ := dirs(t)
	own := func(e ent) ent { return with(e, func(h *tar.Header) { h.Uid, h.Gid = 1234, 5678 }) }
	mustUnpack(t, root,
		own(with(dir("tmp/"), func(h *tar.Header) { h.Mode = 0o1777 })),
		own(with(dir("sgid/"), func(h *tar.Header) { h.Mode = 0o2755 })),
		own(with(reg("suid", "x"), func(h *tar.Header) { h.Mode = 0o4755 })),
		own(with(reg("both", "x"), func(h *tar.Header) { h.Mode = 0o6711 })),
		own(sym("link", "suid")),
		own(ent{hdr: hdr(tar.TypeFifo, "fifo", 0o600)}),
	)
	for name, mode := range map[string]uint32{"tmp": 0o1777, "sgid": 0o2755, "suid": 0o4755, "both": 0o6711, "fifo": 0o600} {
		st := lstat(t, filepath.Join(root, name))
		if st.Mode&0o7777 != mode {
			t.Errorf("%s mode %o, want %o", name, st.Mode&0o7777, mode)
		}
	}
	for _, name := range []string{"tmp", "sgid", "suid", "both", "link", "fifo"} {
		if st := lstat(t, filepath.Join(root, name)); st.Uid != 1234 || st.Gid != 5678 {
			t.Errorf("%s owned by %d:%d, want 1234:5678", name, st.Uid, st.Gid)
		}
	}
}

func TestXattrs(t *testing.T) {
	root, _ := dirs(t)
	mustUnpack(t, root,
		xattr(reg("f", "x"), "user.berth", "file"),
		xattr(dir("d/"), "user.berth", "dir"),
		// Linux refuses user.* on symlinks; that must not fail the layer.
		xattr(sym("s", "f"), "user.berth", "link"),
	)
	for p, want := range map[string]string{"f": "file", "d": "dir"} {
		if v, err := getxattr(filepath.Join(root, p), "user.berth"); err != nil || v != want {
			t.Errorf("%s user.berth = %q, %v; want %q", p, v, err, want)
		}
	}
}

func TestSecurityCapabilitySurvivesChown(t *testing.T) {
	needRoot(t)
	root, _ := dirs(t)
	// v2 file capability: cap_net_bind_service, permitted+effective.
	capv := string([]byte{0, 0, 0, 2, 0, 4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	mustUnpack(t, root, xattr(with(reg("ping", "x"), func(h *tar.Header) { h.Uid, h.Gid, h.Mode = 1234, 5678, 0o755 }), "security.capability", capv))
	if v, err := getxattr(filepath.Join(root, "ping"), "security.capability"); err != nil || v != capv {
		t.Errorf("security.capability = %x, %v; want %x (set after chown)", v, err, capv)
	}
}

func TestTimes(t *testing.T) {
	root, _ := dirs(t)
	at := time.Date(2021, 5, 6, 7, 8, 9, 123456789, time.UTC)
	mt := time.Date(2019, 5, 6, 7, 8, 9, 987654321, time.UTC)
	stamp := func(e ent) ent {
		return with(e, func(h *tar.Header) { h.AccessTime, h.ModTime, h.Format = at, mt, tar.FormatPAX })
	}
	mustUnpack(t, root,
		stamp(dir("d/")),
		stamp(dir("d/sub/")),
		stamp(reg("d/sub/f", "x")), // written after d/sub: must not change its mtime
		stamp(sym("d/s", "sub/f")),
		stamp(ent{hdr: hdr(tar.TypeFifo, "d/p", 0o600)}),
		reg("d/later", "y"), // written last into d
	)
	for _, p := range []string{"d", "d/sub", "d/sub/f", "d/s", "d/p"} {
		st := lstat(t, filepath.Join(root, p))
		if got := time.Unix(st.Mtim.Unix()); !got.Equal(mt) {
			t.Errorf("%s mtime %v, want %v", p, got.UTC(), mt)
		}
		if got := time.Unix(st.Atim.Unix()); !got.Equal(at) {
			t.Errorf("%s atime %v, want %v", p, got.UTC(), at)
		}
	}
	// Without an atime, the mtime is used.
	if st := lstat(t, filepath.Join(root, "d/later")); st.Atim.Sec != testTime.Unix() || st.Mtim.Sec != testTime.Unix() {
		t.Errorf("d/later atime %d mtime %d, want %d", st.Atim.Sec, st.Mtim.Sec, testTime.Unix())
	}
}

func TestWhiteouts(t *testing.T) {
	needRoot(t)
	root, _ := dirs(t)
	st := mustUnpack(t, root,
		dir("etc/"),
		with(reg("etc/.wh.passwd", ""), func(h *tar.Header) { h.Uid, h.Gid = 1234, 5678 }),
		reg(".wh.gone", ""),
		dir("opaque/"),
		reg("opaque/.wh..wh..opq", ""),
		reg("new/deep/.wh..wh..opq", ""), // opaque dir that did not exist yet
		reg("x/.wh..wh.plnk", ""),        // aufs bookkeeping: skipped
		reg("etc/kept", "k"),
	)
	for _, p := range []string{"etc/passwd", "gone"} {
		s := lstat(t, filepath.Join(root, p))
		if s.Mode&unix.S_IFMT != unix.S_IFCHR || s.Rdev != 0 {
			t.Errorf("%s: mode %o rdev %d, want 0/0 char device", p, s.Mode, s.Rdev)
		}
	}
	if s := lstat(t, filepath.Join(root, "etc/passwd")); s.Uid != 1234 || s.Gid != 5678 {
		t.Errorf("etc/passwd whiteout owned by %d:%d, want 1234:5678", s.Uid, s.Gid)
	}
	for _, p := range []string{"opaque", "new/deep"} {
		if v, err := getxattr(filepath.Join(root, p), "trusted.overlay.opaque"); err != nil || v != "y" {
			t.Errorf("%s trusted.overlay.opaque = %q, %v; want y", p, v, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "x")); !os.IsNotExist(err) {
		t.Errorf("aufs .wh..wh.plnk created its parent: %v", err)
	}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if strings.HasPrefix(d.Name(), whiteoutPrefix) {
			t.Errorf("%s exists: whiteouts must not create .wh. files", p)
		}
		return nil
	})
	// etc, 2 whiteouts, opaque, 1 opaque marker, new + deep (implicit), 1 opaque marker, kept
	if st.Inodes != 9 {
		t.Errorf("Inodes = %d, want 9", st.Inodes)
	}
}

func TestWhiteoutReplacesEarlierEntry(t *testing.T) {
	needRoot(t)
	root, _ := dirs(t)
	// A whiteout may name an earlier entry of the same layer and replaces it.
	mustUnpack(t, root, dir("d/"), reg("d/f", "x"), reg(".wh.d", ""))
	if s := lstat(t, filepath.Join(root, "d")); s.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("d mode %o, want char device whiteout", s.Mode)
	}
}

func TestReplace(t *testing.T) {
	root, _ := dirs(t)
	mustUnpack(t, root,
		reg("f", "first"),
		reg("f", "second"), // file over file
		dir("d/"),
		reg("d/child", "c"),
		with(dir("d/"), func(h *tar.Header) { h.Mode = 0o700 }), // dir over dir keeps children
		reg("fd", "file"),
		dir("fd/"), // dir over file
		dir("df/"),
		reg("df/x", "x"),
		reg("df", "now a file"), // file over dir
		sym("s", "f"),
		sym("s", "d"), // symlink over symlink
		reg("l", "link me"),
		hard("h", "f"),
		hard("h", "l"), // hardlink over hardlink
	)
	checkFile(t, filepath.Join(root, "f"), "second")
	checkFile(t, filepath.Join(root, "d/child"), "c")
	if s := lstat(t, filepath.Join(root, "d")); s.Mode&0o7777 != 0o700 {
		t.Errorf("d mode %o, want 700 from the later entry", s.Mode&0o7777)
	}
	if s := lstat(t, filepath.Join(root, "fd")); s.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("fd mode %o, want dir", s.Mode)
	}
	checkFile(t, filepath.Join(root, "df"), "now a file")
	if got, _ := os.Readlink(filepath.Join(root, "s")); got != "d" {
		t.Errorf("s -> %q, want d", got)
	}
	checkFile(t, filepath.Join(root, "h"), "link me")
}

func TestMissingParents(t *testing.T) {
	root, _ := dirs(t)
	st := mustUnpack(t, root, reg("a/b/c.txt", "c"), sym("a/b/link", "c.txt"))
	checkFile(t, filepath.Join(root, "a/b/c.txt"), "c")
	for _, p := range []string{"a", "a/b"} {
		s := lstat(t, filepath.Join(root, p))
		if s.Mode&unix.S_IFMT != unix.S_IFDIR || s.Mode&0o7777 != 0o755 {
			t.Errorf("%s mode %o, want dir 755", p, s.Mode)
		}
	}
	if st.Inodes != 4 {
		t.Errorf("Inodes = %d, want 4", st.Inodes)
	}
}

func TestSymlinkParentInside(t *testing.T) {
	root, _ := dirs(t)
	mustUnpack(t, root,
		dir("usr/lib/"),
		sym("lib", "usr/lib"),
		sym("usr/lib64", "../usr/./lib"),
		reg("lib/a.so", "a"),
		reg("usr/lib64/b.so", "b"),
		hard("lib/c.so", "usr/lib64/b.so"),
	)
	checkFile(t, filepath.Join(root, "usr/lib/a.so"), "a")
	checkFile(t, filepath.Join(root, "usr/lib/b.so"), "b")
	checkFile(t, filepath.Join(root, "usr/lib/c.so"), "b")
	if s := lstat(t, filepath.Join(root, "lib")); s.Mode&unix.S_IFMT != unix.S_IFLNK {
		t.Errorf("lib was replaced: mode %o", s.Mode)
	}
}

func TestTruncated(t *testing.T) {
	root, _ := dirs(t)
	tb := layer(t, reg("big", strings.Repeat("x", 4096)))
	_, err := Unpack(context.Background(), bytes.NewReader(tb[:512+100]), root, Options{})
	if err == nil || !strings.Contains(err.Error(), `entry "big": truncated layer`) {
		t.Errorf("Unpack = %v, want truncated layer error", err)
	}
}

func TestUnknownTypes(t *testing.T) {
	root, _ := dirs(t)
	glob := ent{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "hi"}}}
	vendor := ent{hdr: hdr('V', "volume-label", 0)}
	st := mustUnpack(t, root, glob, vendor, reg("f", "x"))
	des, _ := os.ReadDir(root)
	if len(des) != 1 || des[0].Name() != "f" || st.Inodes != 1 {
		t.Errorf("root holds %v, Inodes %d; want only f", des, st.Inodes)
	}
}

type failReader struct{}

func (failReader) Read([]byte) (int, error) { return 0, errors.New("read past the end marker") }

func TestStopsAtEndMarker(t *testing.T) {
	root, _ := dirs(t)
	r := io.MultiReader(bytes.NewReader(layer(t, reg("f", "x"))), failReader{})
	if _, err := Unpack(context.Background(), r, root, Options{}); err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	checkFile(t, filepath.Join(root, "f"), "x")
}

func TestCanceled(t *testing.T) {
	root, _ := dirs(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Unpack(ctx, bytes.NewReader(layer(t, reg("f", "x"))), root, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Unpack = %v, want context.Canceled", err)
	}
	if des, _ := os.ReadDir(root); len(des) != 0 {
		t.Errorf("canceled unpack wrote %v", des)
	}
}

func TestDirMustBeEmpty(t *testing.T) {
	root, _ := dirs(t)
	os.WriteFile(filepath.Join(root, "old"), nil, 0o644)
	if _, err := unpack(t, root, Options{}, reg("f", "x")); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("Unpack = %v, want not empty error", err)
	}
}

func BenchmarkUnpack(b *testing.B) {
	// 2000 small files in 100 dirs plus a few large ones, roughly a
	// distro base layer.
	var ents []ent
	small := strings.Repeat("s", 3000)
	for d := range 100 {
		name := "usr/share/d" + string(rune('a'+d%26)) + string(rune('a'+d/26)) + "/"
		ents = append(ents, dir(name))
		for f := range 20 {
			ents = append(ents, reg(name+"f"+string(rune('a'+f)), small))
		}
	}
	big := strings.Repeat("b", 8<<20)
	for i := range 4 {
		ents = append(ents, reg("usr/lib/big"+string(rune('0'+i)), big))
	}
	tb := layer(b, ents...)
	b.SetBytes(int64(len(tb)))
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		root := b.TempDir()
		b.StartTimer()
		if _, err := Unpack(context.Background(), bytes.NewReader(tb), root, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
