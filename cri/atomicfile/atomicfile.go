// Package atomicfile replaces a file whole, so that a reader sees its old
// content or its new, never a part: the pod's hosts and resolv.conf
// (sandbox/podfiles), the shim's pid file, the network's IP leases, the
// lazy layer cache's chunks and kept pieces (image/lazy).
//
// It is a leaf package, a foundation beside cri/errkind: every layer may
// import it, it imports nothing of berth.
package atomicfile

import (
	"os"
	"path/filepath"
	"syscall"
)

// TempMark is in the name of every temp file Write makes, which is
// ".NAME" TempMark "RANDOM" beside the file NAME: a dot file, which a
// reader listing the folder can skip, and which a cleanup can find should a
// crash leave one.
const TempMark = ".tmp-"

// Write replaces path with data, mode perm: written to a temp file in
// path's folder and renamed over path. It does not fsync (none of its
// callers' files has to outlive a power loss), and it removes the temp file
// when it fails.
func Write(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, -1, -1)
}

// WriteOwned is Write with the file given to uid and gid before it
// replaces path.
func WriteOwned(path string, data []byte, perm os.FileMode, uid, gid int) error {
	return write(path, data, perm, uid, gid)
}

func write(path string, data []byte, perm os.FileMode, uid, gid int) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+TempMark+"*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil && (uid != -1 || gid != -1) && !ownedBy(tmp, uid, gid) {
		err = tmp.Chown(uid, gid)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// ownedBy says whether f already belongs to uid and gid (-1: any), as a
// file its creator makes for itself does: chown is then skipped, which a
// caller without CAP_CHOWN could not do even to its own ids' file.
func ownedBy(f *os.File, uid, gid int) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && (uid == -1 || uint32(uid) == st.Uid) && (gid == -1 || uint32(gid) == st.Gid)
}
