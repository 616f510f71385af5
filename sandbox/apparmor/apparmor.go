// Package apparmor finds out whether the host enforces AppArmor, writes and
// loads berth's default profile, and looks up the profiles the kernel has.
// It never confines a process itself: libcontainer applies the profile
// named in the container's spec.
package apparmor

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DefaultProfile is the name of berth's RuntimeDefault profile.
const DefaultProfile = "berth-default"

// Where the kernel tells about AppArmor; variables for tests.
var (
	enabledParam = "/sys/module/apparmor/parameters/enabled"
	profilesFile = "/sys/kernel/security/apparmor/profiles"
	parser       = "apparmor_parser"
)

// Host is the host's AppArmor as berth found it at start.
type Host struct {
	enabled    bool
	why        string // why AppArmor is not usable, when it is not
	defaultErr error  // why DefaultProfile is not loaded; nil when it is
}

// Setup looks whether AppArmor is usable: the kernel enforces it and
// apparmor_parser is installed (without the parser, other runtimes too run
// containers as on a host without AppArmor). If it is, Setup writes berth's
// default profile into dir and loads it, replacing an older version. A failed
// load is logged and kept: containers that ask for the default profile are
// then refused with its cause, never run unconfined.
func Setup(dir string, log *slog.Logger) *Host {
	h := &Host{}
	b, err := os.ReadFile(enabledParam)
	if err != nil || !bytes.HasPrefix(b, []byte("Y")) {
		h.why = "AppArmor is not enabled: the kernel does not enforce it"
		return h
	}
	if _, err := exec.LookPath(parser); err != nil {
		h.why = "AppArmor is not enabled: the kernel enforces it but " + parser + " is not installed"
		log.Info("AppArmor profiles are not applied", "why", h.why)
		return h
	}
	h.enabled = true
	if h.defaultErr = loadDefault(dir); h.defaultErr != nil {
		log.Warn("AppArmor is enabled but berth's default profile could not be loaded; containers asking for it are refused",
			"profile", DefaultProfile, "err", h.defaultErr)
	}
	return h
}

func loadDefault(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	file := filepath.Join(dir, DefaultProfile)
	if err := os.WriteFile(file, []byte(defaultProfileText), 0o600); err != nil {
		return err
	}
	// -r replaces a loaded version, -K keeps the kernel-ready cache out of
	// /etc.
	if out, err := exec.Command(parser, "-Kr", file).CombinedOutput(); err != nil {
		return fmt.Errorf("%s -Kr %s: %v: %s", parser, file, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Enabled tells whether berth can confine containers with AppArmor.
func (h *Host) Enabled() bool { return h != nil && h.enabled }

// Why says why AppArmor is not usable ("" when it is).
func (h *Host) Why() string { return h.why }

// Default returns the name of berth's default profile, or why it cannot be
// used.
func (h *Host) Default() (string, error) {
	if h.defaultErr != nil {
		return "", fmt.Errorf("berth's default profile %s is not loaded: %w", DefaultProfile, h.defaultErr)
	}
	return DefaultProfile, nil
}

// Loaded tells whether the kernel has a profile of that name.
func (h *Host) Loaded(name string) (bool, error) {
	f, err := os.Open(profilesFile)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "name (enforce)": the name may hold spaces, the mode never does.
		line := sc.Text()
		if i := strings.LastIndex(line, " ("); i >= 0 && line[:i] == name {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, nil
}
