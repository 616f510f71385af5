package shim_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Set up by TestMain for the privileged tests (run as root only).
var (
	shimBin      string // the berth-shim built for this run (berth-shim-helper beside it)
	rootfs       string // busybox rootfs, with berth-pause as /pause
	cgroupParent string // "/berth-shimtest-<rand>"
	setupErr     error
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		setupErr = fmt.Errorf("needs root")
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "berth-shimtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	b := make([]byte, 4)
	rand.Read(b)
	cgroupParent = "/berth-shimtest-" + hex.EncodeToString(b)
	defer removeCgroupParent()
	setupErr = setup(tmp)
	return m.Run()
}

func setup(tmp string) error {
	rootfs = filepath.Join(tmp, "rootfs")
	// The VM tier (test/vm) has no Go toolchain: it names a folder with a
	// prebuilt, statically linked berth-shim, berth-pause and berth-exec-init.
	if dir := os.Getenv("BERTH_BIN_DIR"); dir != "" {
		shimBin = filepath.Join(dir, "berth-shim")
		return makeRootfs(rootfs, filepath.Join(dir, "berth-pause"))
	}
	shimBin = filepath.Join(tmp, "berth-shim")
	// seccomp: libcontainer's seccomp support, as the Makefile builds berth-shim-helper.
	args := []string{"build", "-tags", "seccomp", "-o", tmp + "/"}
	if os.Getenv("BERTH_RACE") != "" {
		args = append(args, "-race") // races are reported in shim.log, checked by cleanup
	}
	out, err := exec.Command("go", append(args, "github.com/berth-runtime/berth/cmd/berth-shim",
		"github.com/berth-runtime/berth/cmd/berth-shim-helper")...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("build shim: %v\n%s", err, out)
	}
	// berth-pause and berth-exec-init with the Makefile's rule, from the module root.
	out, err = exec.Command("make", "-C", "../..", "--no-print-directory", "BIN="+tmp, "cbins").CombinedOutput()
	if err != nil {
		return fmt.Errorf("build C programs: %v\n%s", err, out)
	}
	return makeRootfs(rootfs, filepath.Join(tmp, "berth-pause"))
}

// makeRootfs builds a busybox-static rootfs, plus the static berth-pause as
// /pause, for pods' containers and pause process.
func makeRootfs(dir, pauseBin string) error {
	bb := "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		out, err := exec.Command("apt-get", "install", "-y", "busybox-static").CombinedOutput()
		if err != nil {
			return fmt.Errorf("install busybox-static: %v\n%s", err, out)
		}
	}
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(bb, filepath.Join(dir, "bin/busybox"), 0o755); err != nil {
		return err
	}
	for _, app := range []string{"sh", "echo", "sleep", "cat", "id", "ls", "head", "tail", "tr", "yes", "touch", "tty", "true"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", app)); err != nil {
			return err
		}
	}
	return copyFile(pauseBin, filepath.Join(dir, "pause"), 0o755)
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// removeCgroupParent removes the test's parent cgroup from every
// hierarchy (v1 controllers and the unified one).
func removeCgroupParent() {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	paths := []string{filepath.Join("/sys/fs/cgroup", cgroupParent)}
	for _, e := range ents {
		if e.IsDir() { // v1 hierarchies; on v2 the files of the root cgroup
			paths = append(paths, filepath.Join("/sys/fs/cgroup", e.Name(), cgroupParent))
		}
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			fmt.Fprintf(os.Stderr, "remove test cgroup: %v\n", err)
		}
	}
}

// leftCgroups lists container cgroups left below the test parent.
func leftCgroups() []string {
	var left []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		subs, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", e.Name(), cgroupParent))
		for _, s := range subs {
			if s.IsDir() {
				left = append(left, e.Name()+":"+s.Name())
			}
		}
	}
	return left
}

func needRoot(t *testing.T) {
	t.Helper()
	if setupErr != nil {
		if strings.Contains(setupErr.Error(), "needs root") {
			t.Skip("privileged test: needs root")
		}
		t.Fatal(setupErr)
	}
}
