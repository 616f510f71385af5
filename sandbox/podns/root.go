package podns

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// PrepareRoot makes dir (the folder that holds every pod's pin folders) a
// private bind mount of itself, once; berthd calls it at start on its pin
// root. Pins mounted below a shared mount would propagate into its peer
// group (for example a container given an rshared bind of /run) and could
// hold namespaces alive there. Repeating it is harmless.
func PrepareRoot(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	if real, err = filepath.Abs(real); err != nil {
		return err
	}
	mounted, err := isMountPoint(real)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(real, real, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("podns: bind %s on itself: %w", real, err)
		}
	}
	if err := unix.Mount("", real, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("podns: make %s rprivate: %w", real, err)
	}
	return nil
}

// isMountPoint reads mountinfo because a bind mount of a folder on itself
// has the same device as its parent, so stat cannot tell.
func isMountPoint(path string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == path {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
