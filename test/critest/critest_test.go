// Package critest runs cri-tools' validation suite (critest, built from
// the module pinned in tool/) against a berthd of the tree: make
// test-vm-critest runs it in the VM under systemd, on cgroup v2 with
// AppArmor. Its images come from a registry the test serves on loopback:
// the suite's specs that pull from the internet are skipped, each named in
// internetSpecs with why. Every spec it runs passes (88 of 88 on
// 2026-11-29). Under TCG the suite takes about 10 minutes (88 specs in
// 608 s), which is why make test does not run it.
package critest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestMain(m *testing.M) { harness.Main(m, "BERTH_INTEGRATION") }

// binEnv names the critest binary (go test -c of
// sigs.k8s.io/cri-tools/cmd/critest, tool/go.mod's version).
const binEnv = "BERTH_CRITEST_BIN"

// internetSpecs are the suite's specs that pull images from public
// registries by fixed names or digests (gcr.io/k8s-staging-cri-tools,
// registry.k8s.io: httpd, nginx, nonewprivs, pause, the test-image-*
// images): the VM reaches no network. Each is a fragment of the spec's
// text, for -ginkgo.skip.
var internetSpecs = []string{
	"when running multiple containers in a pod",                 // httpd
	"should support execSync with timeout",                      // test-image-tag
	"Image Consistency",                                         // test-image-tag
	"should support portforward in host network",                // hostnet-nginx
	"Image Manager",                                             // test-image-*, pause
	"Image Identifier Consistency",                              // test-image-tag, pause
	"Image Volume",                                              // test-image-tag, test-image-predefined-group
	"runtime should support PodPID",                             // nginx
	"runtime should support ContainerPID",                       // nginx
	"SupplementalGroupsPolicy",                                  // test-image-predefined-group
	"should support seccomp localhost profile on the container", // nonewprivs
	"Security Context NoNewPrivs",                               // nonewprivs
	"runtime should support HostPID",                            // nginx
	// Not the internet, but the suite's own image, which is: ipcs, which
	// Debian's busybox-static lacks; and a shell that execs /bin/ls, where
	// Debian's runs its ls applet without looking at the masked path.
	"runtime should support HostIpc",
	"runtime should support MaskedPaths",
}

// busyboxApplets is busybox and every applet of it, where the suite's
// commands (httpd, ping, brctl...) expect them, as hard links: runc masks
// a path (MaskedPaths) by mounting over what it resolves to, and a masked
// applet that is a symlink would mask busybox itself.
func busyboxApplets(t *testing.T) []harness.File {
	out, err := exec.Command("/bin/busybox", "--list-full").Output()
	if err != nil {
		t.Fatalf("busybox --list-full: %v", err)
	}
	files := []harness.File{{Path: "bin/busybox", Content: harness.BusyboxBinary(t), Mode: 0o755}}
	for _, dir := range []string{"sbin", "usr", "usr/bin", "usr/sbin"} {
		files = append(files, harness.Dir(dir, 0o755))
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "bin/busybox" {
			files = append(files, harness.File{Path: p, Type: tar.TypeLink, Link: "bin/busybox"})
		}
	}
	return files
}

func TestCritest(t *testing.T) {
	harness.RequireIntegration(t)
	bin := os.Getenv(binEnv)
	if bin == "" {
		t.Fatalf("%s is not set: build critest (make test-vm-critest does) and name it", binEnv)
	}
	reg := harness.NewRegistry(t)
	applets := busyboxApplets(t)
	busybox := reg.Push(t, "berth/busybox:critest", harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{applets}}))
	web := reg.Push(t, "berth/webserver:critest", harness.BusyboxImage(t, harness.ImageSpec{
		Layers: [][]harness.File{applets, {harness.Reg("www/index.html", "<h1>berth</h1>\n", 0o644)}},
		Config: v1.Config{Cmd: []string{"/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"}},
	}))
	config := harness.PlainHTTP(reg.Host())
	if os.Getenv("BERTH_VM_SYSTEMD") == "1" {
		// The VM booted with systemd: its driver, as a node there runs.
		config = "cgroup_driver = \"systemd\"\n" + config
	}
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: config})

	images := filepath.Join(t.TempDir(), "images.yaml")
	if err := os.WriteFile(images, fmt.Appendf(nil, "defaultTestContainerImage: %s\nwebServerTestImage: %s\n", busybox.Name, web.Name), 0o644); err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + d.Socket
	cmd := exec.CommandContext(t.Context(), bin, "-runtime-endpoint", endpoint, "-image-endpoint", endpoint,
		"-test-images-file", images, "-ginkgo.skip", strings.Join(internetSpecs, "|"), "-ginkgo.no-color", "-ginkgo.v")
	// Streamed as it runs (under TCG the suite takes minutes) and kept for
	// the summary.
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, os.Stdout)
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	err := cmd.Run()
	t.Logf("critest ran %s", time.Since(start).Round(time.Second))
	if m := regexp.MustCompile(`Ran \d+ of \d+ Specs.*\n.*Passed.*`).Find(out.Bytes()); m != nil {
		t.Logf("critest summary: %s", m)
	}
	if err != nil {
		t.Fatalf("critest: %v", err)
	}
}
