package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
)

// The checks CheckpointPod and RestorePod make before anything else, each
// refusing with InvalidArgument what the CRI says a runtime must refuse.
func TestPodCheckpointRequestChecks(t *testing.T) {
	out, full := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	manifest := &podCheckpoint{Containers: []podCkptContainerRef{{Name: "a"}, {Name: "b"}}}
	named := func(names ...string) []*runtimeapi.ContainerConfig {
		var cfgs []*runtimeapi.ContainerConfig
		for _, n := range names {
			cfgs = append(cfgs, &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: n}})
		}
		return cfgs
	}
	for _, c := range []struct {
		name string
		err  error
		ok   bool
	}{
		{"no options", checkNoOptions(nil), true},
		{"an option", checkNoOptions(map[string]string{"k": "v"}), false},
		{"empty output", checkOutputPath(out), true},
		{"relative output", checkOutputPath("out"), false},
		{"missing output", checkOutputPath(filepath.Join(out, "none")), false},
		{"full output", checkOutputPath(full), false},
		{"ids", checkContainerIDs([]string{"x", "y"}), true},
		{"no ids", checkContainerIDs(nil), false},
		{"an empty id", checkContainerIDs([]string{"x", ""}), false},
		{"an id twice", checkContainerIDs([]string{"x", "y", "x"}), false},
		{"the checkpoint's names", checkRestoredNames(manifest, named("b", "a")), true},
		{"a name missing", checkRestoredNames(manifest, named("a")), false},
		{"a name more", checkRestoredNames(manifest, named("a", "b", "c")), false},
		{"a name twice", checkRestoredNames(manifest, named("a", "a", "b")), false},
		{"no configs", checkRestoredNames(manifest, nil), false},
	} {
		if c.ok != (c.err == nil) || (c.err != nil && !errors.Is(c.err, errkind.Invalid)) {
			t.Errorf("%s: %v; want ok %v, else InvalidArgument", c.name, c.err, c.ok)
		}
	}
}

// checkProcess holds a RestorePod container's spec to the checkpointed
// process, but for the pod's hostname; a checkpoint image's restore
// (matchProcess false) takes any.
func TestCheckProcess(t *testing.T) {
	proc := func(args []string, env ...string) *specs.Spec {
		return &specs.Spec{Process: &specs.Process{Args: args, Cwd: "/", Env: env, User: specs.User{UID: 1, GID: 2}}}
	}
	ck := &checkpoint{matchProcess: true, spec: *proc([]string{"/bin/sh", "-c", "x"}, "A=1", "HOSTNAME=old")}
	if err := ck.checkProcess(proc([]string{"/bin/sh", "-c", "x"}, "HOSTNAME=new", "A=1")); err != nil {
		t.Errorf("the same process in a pod of another hostname: %v", err)
	}
	for _, s := range []*specs.Spec{proc([]string{"/bin/sh"}, "A=1"), proc([]string{"/bin/sh", "-c", "x"}, "A=2")} {
		if err := ck.checkProcess(s); !errors.Is(err, errkind.Invalid) {
			t.Errorf("process %v %v: %v, want InvalidArgument", s.Process.Args, s.Process.Env, err)
		}
	}
	ck.matchProcess = false
	if err := ck.checkProcess(proc([]string{"/other"})); err != nil {
		t.Errorf("a checkpoint image's restore: %v", err)
	}
}
