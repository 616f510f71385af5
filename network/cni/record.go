package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// record is what DEL needs of a pod's ADD, kept in StateDir/<pod>.json
// from just before ADD until DEL succeeded.
type record struct {
	File    string          `json:"file"`    // the configuration file ADD used, for messages
	Network string          `json:"network"` // its name
	Config  json.RawMessage `json:"config"`  // the configuration list, every plugin inline
	IfName  string          `json:"ifName"`
	NetNS   string          `json:"netns"` // the namespace pin ADD was given
	Args    [][2]string     `json:"args"`
	Caps    map[string]any  `json:"capabilityArgs,omitempty"`
}

func (n *Network) recordPath(pod string) string { return filepath.Join(n.cfg.StateDir, pod+".json") }

// writeRecord writes the file atomically and durably: after a crash the
// record is either absent (ADD never ran) or whole.
func (n *Network) writeRecord(pod string, r *record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(n.cfg.StateDir, 0o700); err != nil {
		return err
	}
	p := n.recordPath(pod)
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cni: pod record: %w", err)
	}
	return syncDir(n.cfg.StateDir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readRecord returns the pod's record, or an error wrapping os.ErrNotExist.
func (n *Network) readRecord(pod string) (*record, error) {
	b, err := os.ReadFile(n.recordPath(pod))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("cni: pod record %s: %w", n.recordPath(pod), err)
	}
	return &r, nil
}

func (n *Network) removeRecord(pod string) error {
	err := os.Remove(n.recordPath(pod))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// recordedPods lists the pods that have a record.
func (n *Network) recordedPods() ([]string, error) {
	entries, err := os.ReadDir(n.cfg.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pods []string
	for _, e := range entries {
		if pod, ok := strings.CutSuffix(e.Name(), ".json"); ok && checkPodID(pod) == nil {
			pods = append(pods, pod)
		}
	}
	return pods, nil
}

// isNetNS reports whether path is a network namespace (a pin still
// mounted), not the empty file a pin leaves after its namespace was
// released or the machine rebooted.
func isNetNS(path string) bool {
	if path == "" {
		return false
	}
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}
