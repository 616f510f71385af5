package shim_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// A container created for a restore has no process until Start. A restore
// CRIU cannot do (images that are not CRIU's, or no CRIU at all) fails
// Start with ErrRestore and leaves no cgroup; the container, still
// created, is then killed and deleted without a process, as a created one
// is.
func TestRestoreFailsThenKilled(t *testing.T) {
	p := newPod(t)
	ctx := ctxT(t)
	bundle := shim.ContainerDir(p.dir, "r")
	p.writeSpec("r", []string{"sleep", "1000"}, func(s *specs.Spec) {
		s.Annotations = map[string]string{shim.AnnotationCRIUConfig: filepath.Join(bundle, shim.CRIUConfigFile)}
	})
	p.ids = append(p.ids, "r")
	images := t.TempDir()
	if err := os.WriteFile(filepath.Join(images, "inventory.img"), []byte("not a CRIU image"), 0o600); err != nil {
		t.Fatal(err)
	}
	req := shim.CreateRequest{ID: "r", LogPath: p.logPath("r"),
		Restore: &shim.RestoreRequest{ImagesDir: images, WorkDir: filepath.Join(t.TempDir(), "work")}}
	if err := p.c.CreateRestored(ctx, req); err != nil {
		t.Fatal(err)
	}
	if st, err := p.c.State(ctx, "r"); err != nil || st.Status != shim.StatusCreated || st.Pid != 0 {
		t.Fatalf("created for a restore: %+v (%v), want created with no process", st, err)
	}
	_, err := p.c.Start(ctx, "r")
	if !errors.Is(err, shim.ErrRestore) {
		t.Fatalf("Start of a restore from images that are not CRIU's: %v, want %v", err, shim.ErrRestore)
	}
	t.Logf("the failed restore: %v", err)
	for _, cg := range leftCgroups() {
		if strings.HasSuffix(cg, ":"+p.cg+"r") {
			t.Errorf("the failed restore left its cgroup %s", cg)
		}
	}
	if err := p.c.Kill(ctx, "r", syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	if st := p.wait("r"); st.Status != shim.StatusStopped || st.ExitCode != 137 || !st.StartedAt.IsZero() {
		t.Fatalf("after the kill: %+v, want stopped by SIGKILL, never started", st)
	}
	if _, err := p.c.Start(ctx, "r"); !errors.Is(err, shim.ErrNotCreated) {
		t.Fatalf("Start after the kill: %v, want %v", err, shim.ErrNotCreated)
	}
	if err := p.c.Delete(ctx, "r"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}
