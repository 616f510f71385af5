package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// cdiKind is the kind of the GPU check's CDI devices, NVIDIA's own: the
// check asks for nvidia.com/gpu=all as a device plugin or DRA driver would.
const cdiKind = "nvidia.com/gpu"

// driverLibraries are the NVIDIA driver libraries a CUDA program and
// nvidia-smi load (libcuda loads the PTX JIT compiler and, on newer
// drivers, gpucomp and nvvm itself), by name up to ".so"; every file
// named NAME or NAME.* in a library folder is mounted, the soname links
// ("libcuda.so.1") and the versioned files alike.
var driverLibraries = []string{
	"libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
	"libnvidia-nvvm.so", "libnvidia-gpucomp.so",
}

// requiredFiles must be among what discover finds: what cuda-vecadd and
// nvidia-smi open by name.
var requiredFiles = []string{"libcuda.so.1", "libnvidia-ml.so.1"}

// controlNodes are the driver's device nodes besides one per GPU; every
// container given a GPU needs nvidiactl and (for CUDA) nvidia-uvm.
var (
	controlNodes  = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}
	requiredNodes = []string{"nvidiactl", "nvidia-uvm"}
)

// libraryDirs are where distributions' NVIDIA packages and the .run
// installer put the libraries; on the host, the folders `ldconfig -p`
// names for them come first.
var libraryDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
	"/usr/lib64", "/lib64", "/usr/lib", "/lib",
}

// binaryDirs are searched in order for nvidia-smi.
var binaryDirs = []string{"/usr/bin", "/usr/sbin", "/bin", "/usr/local/bin", "/usr/local/nvidia/bin"}

// deviceNode is a character device of the driver: its path in the
// container (the host's, below the layout's root) and its numbers.
type deviceNode struct {
	path         string
	major, minor int64
}

// driverLayout is what the NVIDIA driver installed, found below root ("/"
// on a GPU host, a fake tree in the tests and the dry run). Paths are as
// the container sees them: the host's, without root.
type driverLayout struct {
	root      string
	gpus      []deviceNode // /dev/nvidiaN, by N
	control   []deviceNode // nvidiactl, nvidia-uvm, ...
	libraries []string
	nvidiaSMI string
}

// discover finds the driver's device nodes, libraries and nvidia-smi below
// root; extraLibDirs are searched first. It fails naming what is missing.
func discover(root string, extraLibDirs []string) (*driverLayout, error) {
	l := &driverLayout{root: root}
	var err error
	if l.gpus, err = gpuNodes(root); err != nil {
		return nil, err
	}
	for _, name := range controlNodes {
		n, err := statDevice(root, "/dev/"+name)
		if errors.Is(err, fs.ErrNotExist) && !slices.Contains(requiredNodes, name) {
			continue
		}
		if err != nil {
			return nil, hint(err, name)
		}
		l.control = append(l.control, n)
	}
	if l.libraries, err = findLibraries(root, append(slices.Clone(extraLibDirs), libraryDirs...)); err != nil {
		return nil, err
	}
	for _, dir := range binaryDirs {
		p := path.Join(dir, "nvidia-smi")
		if fi, err := os.Stat(filepath.Join(root, p)); err == nil && fi.Mode().IsRegular() {
			l.nvidiaSMI = p
			break
		}
	}
	if l.nvidiaSMI == "" {
		return nil, fmt.Errorf("nvidia-smi not found in %s below %s", strings.Join(binaryDirs, ", "), root)
	}
	return l, nil
}

// hint adds what creates a missing node: nvidia-uvm appears only once
// something loaded the uvm module (a CUDA program, or nvidia-modprobe).
func hint(err error, name string) error {
	if errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(name, "nvidia-uvm") {
		return fmt.Errorf("%w (run `nvidia-modprobe -u -c=0` as root to load nvidia-uvm and make its nodes)", err)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w (is the NVIDIA driver loaded? `nvidia-smi` on the host makes the nodes)", err)
	}
	return err
}

// gpuNodes lists /dev/nvidiaN, sorted by N; there must be one at least.
func gpuNodes(root string) ([]deviceNode, error) {
	matches, _ := filepath.Glob(filepath.Join(root, "dev", "nvidia[0-9]*")) // the pattern is valid
	var nodes []deviceNode
	for _, m := range matches {
		name := filepath.Base(m)
		if _, err := strconv.Atoi(strings.TrimPrefix(name, "nvidia")); err != nil {
			continue
		}
		n, err := statDevice(root, "/dev/"+name)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return nil, hint(fmt.Errorf("no GPU device node %s: %w", filepath.Join(root, "dev", "nvidia0"), fs.ErrNotExist), "nvidia0")
	}
	slices.SortFunc(nodes, func(a, b deviceNode) int { return gpuIndex(a) - gpuIndex(b) })
	return nodes, nil
}

// gpuIndex is N of /dev/nvidiaN: the CDI device's name.
func gpuIndex(n deviceNode) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(path.Base(n.path), "nvidia"))
	return i
}

// statDevice reads the numbers of the character device at p below root
// (a symbolic link is followed: the tests link to /dev/null).
func statDevice(root, p string) (deviceNode, error) {
	fi, err := os.Stat(filepath.Join(root, p))
	if err != nil {
		return deviceNode{}, err
	}
	if fi.Mode()&fs.ModeCharDevice == 0 {
		return deviceNode{}, fmt.Errorf("%s is not a character device", filepath.Join(root, p))
	}
	major, minor := devNumbers(fi)
	return deviceNode{path: p, major: major, minor: minor}, nil
}

// devNumbers are the major and minor numbers of a device's FileInfo.
func devNumbers(fi os.FileInfo) (major, minor int64) {
	rdev := uint64(fi.Sys().(*syscall.Stat_t).Rdev) //nolint:unconvert // uint32 on some platforms
	return int64(unix.Major(rdev)), int64(unix.Minor(rdev))
}

// findLibraries lists the driver libraries in dirs below root, and fails
// when a required one is missing. A name is taken from the first folder
// that has it: merged /usr makes /lib/x86_64-linux-gnu the same folder as
// /usr/lib/x86_64-linux-gnu, and a second copy elsewhere would be another
// build (32-bit, or an older driver's leftover) the loader would not pick.
func findLibraries(root string, dirs []string) ([]string, error) {
	var libs []string
	found := map[string]bool{}
	for _, dir := range dirs {
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if !isDriverLibrary(e.Name()) || found[e.Name()] {
				continue
			}
			// A dangling link or a folder is no library.
			if fi, err := os.Stat(filepath.Join(root, dir, e.Name())); err != nil || !fi.Mode().IsRegular() {
				continue
			}
			found[e.Name()] = true
			libs = append(libs, path.Join(dir, e.Name()))
		}
	}
	for _, name := range requiredFiles {
		if !found[name] {
			return nil, fmt.Errorf("driver library %s not found in %s below %s", name, strings.Join(dirs, ", "), root)
		}
	}
	return libs, nil
}

func isDriverLibrary(name string) bool {
	return slices.ContainsFunc(driverLibraries, func(lib string) bool {
		return name == lib || strings.HasPrefix(name, lib+".")
	})
}

// ldconfigDirs are the folders the host's linker cache names for driver
// libraries of this machine's ABI ("\tlibcuda.so.1 (libc6,x86-64) =>
// /usr/lib/x86_64-linux-gnu/libcuda.so.1"); the 32-bit builds some hosts
// also have ("(libc6)") are not for the container's 64-bit loader.
func ldconfigDirs(ldconfigOutput []byte, abi string) []string {
	var dirs []string
	sc := bufio.NewScanner(bytes.NewReader(ldconfigOutput))
	for sc.Scan() {
		entry, target, ok := strings.Cut(strings.TrimSpace(sc.Text()), " => ")
		name, tags, _ := strings.Cut(entry, " ")
		if !ok || !isDriverLibrary(name) || !strings.Contains(tags, ","+abi) {
			continue
		}
		if dir := path.Dir(target); !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

// ldconfigABI is how ldconfig -p tags libraries of this machine's ABI.
var ldconfigABI = map[string]string{"amd64": "x86-64", "arm64": "AArch64"}[runtime.GOARCH]

// hostLibraryDirs asks the host's ldconfig (none, none found).
func hostLibraryDirs() []string {
	for _, ldconfig := range []string{"/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real"} {
		if out, err := exec.Command(ldconfig, "-p").Output(); err == nil {
			return ldconfigDirs(out, ldconfigABI)
		}
	}
	return nil
}

// spec is the CDI spec of the layout: one device per GPU ("0", "1", ...)
// and "all"; the control nodes, the libraries and nvidia-smi (read-only
// binds at their host paths) and LD_LIBRARY_PATH (the container's loader
// has no cache entry for them) go with every device.
func (l *driverLayout) spec() (*cdispecs.Spec, error) {
	s := &cdispecs.Spec{Kind: cdiKind}
	var all []*cdispecs.DeviceNode
	for _, g := range l.gpus {
		s.Devices = append(s.Devices, cdispecs.Device{
			Name:           strconv.Itoa(gpuIndex(g)),
			ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: []*cdispecs.DeviceNode{l.node(g)}},
		})
		all = append(all, l.node(g))
	}
	s.Devices = append(s.Devices, cdispecs.Device{Name: "all", ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: all}})

	edits := &s.ContainerEdits
	for _, c := range l.control {
		edits.DeviceNodes = append(edits.DeviceNodes, l.node(c))
	}
	var libDirs []string
	for _, p := range append(slices.Clone(l.libraries), l.nvidiaSMI) {
		edits.Mounts = append(edits.Mounts, &cdispecs.Mount{
			HostPath: filepath.Join(l.root, p), ContainerPath: p, Type: "bind",
			Options: []string{"ro", "nosuid", "nodev", "bind"},
		})
		if dir := path.Dir(p); p != l.nvidiaSMI && !slices.Contains(libDirs, dir) {
			libDirs = append(libDirs, dir)
		}
	}
	edits.Env = []string{"LD_LIBRARY_PATH=" + strings.Join(libDirs, ":")}

	v, err := cdispecs.MinimumRequiredVersion(s)
	if err != nil {
		return nil, err
	}
	s.Version = v
	return s, nil
}

// node is n's CDI entry: the numbers are written out, so that the spec
// needs no stat of the node when a container asks for it.
func (l *driverLayout) node(n deviceNode) *cdispecs.DeviceNode {
	return &cdispecs.DeviceNode{Path: n.path, HostPath: filepath.Join(l.root, n.path), Type: "c", Major: n.major, Minor: n.minor}
}

// writeSpec writes s as JSON to file (made 0644: berthd reads it as root,
// operators read it to see what the check gave the container).
func writeSpec(file string, s *cdispecs.Spec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}
