package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The fake driver's device numbers (for the dry run, which makes real
// nodes): /dev/kmsg's 1:11 stands for the GPU and /dev/fuse's 10:229 for
// the control nodes. No container may open either by default, and opening
// them write-only needs nothing but the device cgroup's leave (no
// capability, and nothing is written), so they show what the CDI spec's
// cgroup rules allow just as the real nodes would.
var fakeNodes = []struct {
	name         string
	major, minor uint32
}{
	{"nvidia0", 1, 11},
	{"nvidiactl", 10, 229},
	{"nvidia-uvm", 10, 229},
}

// fakeLibDir is where the fake driver's libraries lie, as on Debian and
// Ubuntu; lib is a link to usr/lib, as with merged /usr.
const fakeLibDir = "/usr/lib/x86_64-linux-gnu"

// fakeSMI is the fake nvidia-smi: it prints `nvidia-smi -L`'s line format.
const fakeSMI = `#!/bin/sh
echo "GPU 0: Fake GPU (berth dry run) (UUID: GPU-00000000-0000-0000-0000-000000000000)"
`

// writeFakeDriver lays out a fake NVIDIA driver below root: device nodes
// made by mkdev, libcuda (the versioned file and its soname link) with
// the content of libcuda (the fake libcuda.so.1 built from fakecuda.c, or
// any bytes in the unit tests), a stand-in libnvidia-ml and nvidia-smi.
func writeFakeDriver(root string, libcuda []byte, mkdev func(path string, major, minor uint32) error) error {
	for _, d := range []string{"dev", "usr/bin", "usr/lib/x86_64-linux-gnu"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		return err
	}
	for _, n := range fakeNodes {
		if err := mkdev(filepath.Join(root, "dev", n.name), n.major, n.minor); err != nil {
			return fmt.Errorf("fake device node %s: %w", n.name, err)
		}
	}
	lib := filepath.Join(root, fakeLibDir)
	files := []struct {
		name    string
		content []byte
	}{
		{"libcuda.so.999.99", libcuda},
		{"libnvidia-ml.so.999.99", []byte("not a library: the fake nvidia-smi loads nothing\n")},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(lib, f.name), f.content, 0o755); err != nil {
			return err
		}
	}
	for link, target := range map[string]string{"libcuda.so.1": "libcuda.so.999.99", "libnvidia-ml.so.1": "libnvidia-ml.so.999.99"} {
		if err := os.Symlink(target, filepath.Join(lib, link)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(root, "usr/bin/nvidia-smi"), []byte(fakeSMI), 0o755)
}

// mknod makes a character device node (root only): the dry run's.
func mknod(path string, major, minor uint32) error {
	return unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor)))
}
