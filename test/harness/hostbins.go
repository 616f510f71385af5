package harness

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// HostProgramFiles are the layer entries that run the host's dynamically
// linked program bin (an absolute path) in a container: the program and
// every shared library ldd names for it, the loader included, each at its
// host path with symlinks followed, below the folders that hold them. The
// test fails, naming the package to install, when bin is missing.
func HostProgramFiles(t testing.TB, bin, debianPackage string) []File {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("this test needs %s from Debian's %s (apt-get install -y %s): %v", bin, debianPackage, debianPackage, err)
	}
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bin, err)
	}
	paths := []string{bin}
	// ldd prints "libc.so.6 => /lib/…/libc.so.6 (0x…)", the loader as
	// "/lib64/ld-linux-x86-64.so.2 (0x…)" and the vDSO without a path.
	for _, field := range strings.Fields(string(out)) {
		if strings.HasPrefix(field, "/") {
			paths = append(paths, field)
		}
	}
	var files []File
	for _, p := range paths {
		content, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s (for %s): %v", p, bin, err)
		}
		files = append(files, File{Path: strings.TrimPrefix(p, "/"), Content: content, Mode: 0o755})
	}
	return withParents(files)
}

// withParents puts a directory entry (0755) before files for each folder
// they are in that no entry of files is.
func withParents(files []File) []File {
	seen := map[string]bool{".": true}
	for _, f := range files {
		seen[f.Path] = true
	}
	var out []File
	for _, f := range files {
		var dirs []string
		for d := path.Dir(f.Path); !seen[d]; d = path.Dir(d) {
			seen[d] = true
			dirs = append([]string{d}, dirs...)
		}
		for _, d := range dirs {
			out = append(out, Dir(d, 0o755))
		}
		out = append(out, f)
	}
	return out
}

// StaticGoProgram builds src, a main package of the standard library alone,
// into a static binary (CGO_ENABLED=0) that runs in any image, and returns it.
func StaticGoProgram(t testing.TB, src string) []byte {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"go.mod":  "module berthtestprogram\n\ngo 1.26\n",
		"main.go": src,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goTool(), "build", "-trimpath", "-o", "program", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of a test program: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "program"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// PinnedProgram is the program pkg at the version the module in test/module
// pins (a module of its own, so that berth's go.mod does not carry its
// dependencies): the binary the environment variable env names (built on
// the host for the VM tier, which has no Go), else one built here, without
// cgo (Go's build cache keeps the build after the first).
func PinnedProgram(t testing.TB, env, module, pkg string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		return bin
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), path.Base(pkg))
	cmd := exec.Command(goTool(), "build", "-trimpath", "-o", bin, pkg)
	cmd.Dir = filepath.Join(root, "test", module)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s (test/%s): %v\n%s", pkg, module, err, out)
	}
	return bin
}
