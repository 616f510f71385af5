// Package atomicfile replaces a file whole, so that a reader sees its old
// content or its new, never a part: the pod's hosts and resolv.conf
// (sandbox/podfiles), the shim's pid file, the network's IP leases.
//
// It is a leaf package, a foundation beside cri/errkind: every layer may
// import it, it imports nothing of berth.
package atomicfile

import (
	"os"
	"path/filepath"
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
	if err == nil && (uid != -1 || gid != -1) {
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
