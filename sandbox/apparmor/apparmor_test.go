package apparmor

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeKernel points the package at files of a fake kernel and a fake
// apparmor_parser that records its arguments (or fails when fail is set).
func fakeKernel(t *testing.T, enabled string, fail bool) (dir string) {
	t.Helper()
	dir = t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	oldEnabled, oldProfiles, oldParser := enabledParam, profilesFile, parser
	t.Cleanup(func() { enabledParam, profilesFile, parser = oldEnabled, oldProfiles, oldParser })
	enabledParam = write("enabled", enabled, 0o644)
	profilesFile = write("profiles", "berth-default (enforce)\nwith space (complain)\n/usr/bin/man (enforce)\n", 0o644)
	script := "#!/bin/sh\necho \"$@\" > " + filepath.Join(dir, "parser-args") + "\n"
	if fail {
		script = "#!/bin/sh\necho 'syntax error' >&2\nexit 1\n"
	}
	parser = write("apparmor_parser", script, 0o755)
	return dir
}

func TestSetupDisabled(t *testing.T) {
	dir := fakeKernel(t, "N\n", false)
	h := Setup(filepath.Join(dir, "state"), slog.Default())
	if h.Enabled() || !strings.Contains(h.Why(), "does not enforce") {
		t.Fatalf("enabled %v (%q) with N in the module parameter", h.Enabled(), h.Why())
	}
	if _, err := os.Stat(filepath.Join(dir, "parser-args")); err == nil {
		t.Fatal("apparmor_parser ran on a host without AppArmor")
	}
}

// Without apparmor_parser a host is as one without AppArmor, as for other
// runtimes.
func TestSetupWithoutParser(t *testing.T) {
	dir := fakeKernel(t, "Y\n", false)
	parser = filepath.Join(dir, "no-such-parser")
	h := Setup(filepath.Join(dir, "state"), slog.Default())
	if h.Enabled() || !strings.Contains(h.Why(), "no-such-parser is not installed") {
		t.Fatalf("enabled %v (%q) without apparmor_parser", h.Enabled(), h.Why())
	}
}

func TestSetupLoadsDefault(t *testing.T) {
	dir := fakeKernel(t, "Y\n", false)
	state := filepath.Join(dir, "state")
	h := Setup(state, slog.Default())
	if !h.Enabled() {
		t.Fatal("not enabled with Y in the module parameter")
	}
	if p, err := h.Default(); p != DefaultProfile || err != nil {
		t.Fatalf("Default() = %q, %v", p, err)
	}
	args, _ := os.ReadFile(filepath.Join(dir, "parser-args"))
	file := filepath.Join(state, DefaultProfile)
	if string(args) != "-Kr "+file+"\n" {
		t.Fatalf("apparmor_parser ran with %q", args)
	}
	if b, err := os.ReadFile(file); err != nil || !strings.Contains(string(b), "profile berth-default ") {
		t.Fatalf("profile file: %v", err)
	}
	for name, want := range map[string]bool{"berth-default": true, "with space": true, "/usr/bin/man": true, "berth": false, "man": false} {
		if got, err := h.Loaded(name); got != want || err != nil {
			t.Errorf("Loaded(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
}

func TestSetupParserFails(t *testing.T) {
	dir := fakeKernel(t, "Y\n", true)
	h := Setup(filepath.Join(dir, "state"), slog.Default())
	if _, err := h.Default(); err == nil || !strings.Contains(err.Error(), "syntax error") {
		t.Fatalf("Default() error %v, want the parser's output", err)
	}
}
