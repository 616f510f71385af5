package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/cgroups"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The CDI device of these tests is a node the test makes with /dev/kmsg's
// numbers (1:11): no container is allowed it by default, and opening it
// for writing only needs the device cgroup's leave (not CAP_SYSLOG, and
// nothing is written). /dev/fuse's numbers (10:229) are the "other"
// device no rule allows: its open needs no capability either.
const (
	cdiDeviceName = "vendor.test/dev=one"
	cdiCtrPath    = "/dev/cdi-test"
	cdiGID        = 4242
	cdiEnv        = "BERTH_CDI_TEST=one"
	cdiMountPath  = "/cdi/file"
)

// cdiSetup is what the test wrote on the host for its CDI spec.
type cdiSetup struct {
	specDir, hookLog, mountText string
}

// recordingSleeper writes the environment and groups of the container's
// own process, then sleeps.
var recordingSleeper = []string{"/bin/sh", "-c", "env > /tmp/env; id -G > /tmp/groups.tmp; mv /tmp/groups.tmp /tmp/groups; exec sleep 100000"}

// untilRecorded waits (up to 10 s) for recordingSleeper's files: the
// container runs before its script has written them.
const untilRecorded = "for i in $(seq 100); do [ -e /tmp/groups ] && break; sleep 0.1; done; "

// writeCDISpec makes the device node, the file to mount and the hook's
// log in dir, and a spec for vendor.test/dev=one using them in specDir.
func writeCDISpec(t *testing.T, dir, specDir string) cdiSetup {
	t.Helper()
	node := filepath.Join(dir, "node")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 11))); err != nil {
		t.Fatal(err)
	}
	s := cdiSetup{specDir: specDir, hookLog: filepath.Join(dir, "hook.log"), mountText: "mounted by CDI\n"}
	src := filepath.Join(dir, "mounted")
	if err := os.WriteFile(src, []byte(s.mountText), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{
		"cdiVersion": "0.7.0",
		"kind":       "vendor.test/dev",
		"devices": []any{map[string]any{
			"name": "one",
			"containerEdits": map[string]any{
				"deviceNodes": []any{map[string]any{"path": cdiCtrPath, "hostPath": node}},
				"env":         []string{cdiEnv},
				"mounts":      []any{map[string]any{"hostPath": src, "containerPath": cdiMountPath, "options": []string{"ro", "bind"}}},
				// createRuntime hooks run in the runtime's namespaces:
				// the host's /bin/sh, with the container's state on stdin.
				"hooks":          []any{map[string]any{"hookName": "createRuntime", "path": "/bin/sh", "args": []string{"sh", "-c", "cat >> " + s.hookLog + "; echo >> " + s.hookLog}}},
				"additionalGids": []int{cdiGID},
			},
		}},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "vendor-test.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// openScript opens the character device at path for writing (and writes
// nothing) and says whether that worked, with the error when not.
func openScript(path string) string {
	return fmt.Sprintf("if [ ! -c %[1]s ]; then echo not a device; elif (exec 3>%[1]s) 2>/tmp/err; then echo open; else cat /tmp/err; fi", path)
}

// TestCDIDevices: a container given a CDI device gets every edit of its
// spec (device node and its cgroup rule, env, mount, hook, additional
// group), the device cgroup allows that device and no other, the
// annotation form works, an unknown device is refused naming it and
// leaves nothing, and berthctl info lists the device. The spec is written
// after berthd started: the spec folder is re-read.
func TestCDIDevices(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	specDir := filepath.Join(dir, "cdi")
	if err := os.Mkdir(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("[cdi]\nspec_dirs = [%q]\n", specDir))
	if out, err := e.d.Berthctl("info"); err != nil || !strings.Contains(out, "cdi devices:    none") {
		t.Errorf("berthctl info before the spec: %v\n%s", err, out)
	}
	setup := writeCDISpec(t, dir, specDir)
	if out, err := e.d.Berthctl("info"); err != nil || !strings.Contains(out, "cdi device:     "+cdiDeviceName+"\n") {
		t.Errorf("berthctl info does not list %s: %v\n%s", cdiDeviceName, err, out)
	}

	cfg := e.podConfig("cdi")
	pod := e.runPod(t, cfg)

	withField := e.ctrConfig("field", recordingSleeper...)
	withField.CDIDevices = []*runtimeapi.CDIDevice{{Name: cdiDeviceName}}
	field := e.runContainer(t, pod, cfg, withField)
	checkCDIEdits(t, e, field, setup)
	checkDeviceCgroup(t, e, field, filepath.Join(cfg.Linux.CgroupParent, field))

	withAnnotation := e.ctrConfig("annotation", recordingSleeper...)
	withAnnotation.Annotations = map[string]string{"cdi.k8s.io/test-plugin": cdiDeviceName}
	annotated := e.runContainer(t, pod, cfg, withAnnotation)
	checkCDIEdits(t, e, annotated, setup)

	// Without CDI the same numbers are refused: the allow rule above is CDI's.
	plain := e.runContainer(t, pod, cfg, e.ctrConfig("plain", recordingSleeper...))
	if got := e.sh(t, plain, "mknod /tmp/k c 1 11 && "+openScript("/tmp/k")); !strings.Contains(got, "Operation not permitted") {
		t.Errorf("a container without the CDI device opened 1:11: %q", got)
	}
	if got := e.sh(t, plain, untilRecorded+"cat /tmp/env /tmp/groups; ls "+cdiCtrPath+" "+cdiMountPath+" 2>&1; true"); strings.Contains(got, cdiEnv) || strings.Contains(got, strconv.Itoa(cdiGID)) || strings.Count(got, "No such file") != 2 {
		t.Errorf("a container without the CDI device has its edits: %q", got)
	}

	unknown := e.ctrConfig("unknown", sleeper...)
	unknown.CDIDevices = []*runtimeapi.CDIDevice{{Name: cdiDeviceName}, {Name: "vendor.test/dev=nope"}}
	_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: unknown})
	assertCode(t, err, one(codes.FailedPrecondition), "vendor.test/dev=nope")
	ctrs, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{})
	if err != nil || len(ctrs.Containers) != 3 {
		t.Errorf("containers after the refused one: %v, %v (want the 3 made before)", ctrs.GetContainers(), err)
	}
	if n := strings.Count(readHookLog(t, setup.hookLog), `"id"`); n != 2 {
		t.Errorf("the hook ran %d times, want 2 (the two containers with the device)", n)
	}

	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// checkCDIEdits checks that the container sees every edit of the spec.
func checkCDIEdits(t *testing.T, e *podEnv, id string, setup cdiSetup) {
	t.Helper()
	if got := e.sh(t, id, openScript(cdiCtrPath)); got != "open" {
		t.Errorf("%s: open %s: %q", id, cdiCtrPath, got)
	}
	if got := e.sh(t, id, "stat -c '%t:%T %F' "+cdiCtrPath); got != "1:b character special file" {
		t.Errorf("%s: %s is %q, want 1:b (hex) character special file", id, cdiCtrPath, got)
	}
	if env := e.sh(t, id, untilRecorded+"cat /tmp/env"); !strings.Contains("\n"+env+"\n", "\n"+cdiEnv+"\n") {
		t.Errorf("%s: environment lacks %s:\n%s", id, cdiEnv, env)
	}
	if got := e.sh(t, id, "cat "+cdiMountPath); got+"\n" != setup.mountText {
		t.Errorf("%s: %s holds %q, want %q", id, cdiMountPath, got, setup.mountText)
	}
	if got := e.sh(t, id, untilRecorded+"cat /tmp/groups"); !slices.Contains(strings.Fields(got), strconv.Itoa(cdiGID)) {
		t.Errorf("%s: groups %q lack %d", id, got, cdiGID)
	}
	if log := readHookLog(t, setup.hookLog); !strings.Contains(log, id) {
		t.Errorf("the createRuntime hook did not run for %s: %q", id, log)
	}
}

// checkDeviceCgroup: the CDI device's rule is in force and no other
// device is let in. cgroup v2's eBPF program cannot be read back, so the
// proof there is what a process can open; v1 shows the list too.
func checkDeviceCgroup(t *testing.T, e *podEnv, id, cgroup string) {
	t.Helper()
	if got := e.sh(t, id, "mknod /tmp/other c 10 229 && "+openScript("/tmp/other")); !strings.Contains(got, "Operation not permitted") {
		t.Errorf("a device no rule allows (10:229) was opened: %q", got)
	}
	if got := e.sh(t, id, "mknod /tmp/same c 1 11 && "+openScript("/tmp/same")); got != "open" {
		t.Errorf("the CDI device's numbers under another name: %q", got)
	}
	if cgroups.DetectMode() == cgroups.V2 {
		return
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/devices", cgroup, "devices.list"))
	if err != nil {
		t.Fatal(err)
	}
	list := string(b)
	if !strings.Contains(list, "c 1:11 rwm\n") || strings.Contains(list, "a *:* rwm") || strings.Contains(list, "c 10:229") {
		t.Errorf("devices.list of %s:\n%s", cgroup, list)
	}
}

func readHookLog(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the hook's log: %v", err)
	}
	return string(b)
}
